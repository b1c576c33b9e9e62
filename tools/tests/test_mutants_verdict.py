"""The mutation test's bookkeeping (``conformance.mutants_plugin`` and ``conformance.mutants.verdict``): a mutant is
caught only by a check's own failed assertion, in a check that passed on the unmutated reference; errors, crashes
and the spec-drift guard are never catches."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conformance import mutants_plugin
from conformance.mutants import DRIFT_GUARD, verdict


def _record(outcomes, nodeid: str, when: str, outcome: str, exc: BaseException | None = None) -> None:
    """Drive the plugin's report hook wrapper as pytest does: a phase's call, then its report."""
    excinfo = None
    if exc is not None:
        try:
            raise exc
        except BaseException:
            excinfo = pytest.ExceptionInfo.from_current()
    call = SimpleNamespace(when=when, excinfo=excinfo)
    report = SimpleNamespace(when=when, outcome=outcome, failed=outcome == "failed", skipped=outcome == "skipped")
    hook = outcomes.pytest_runtest_makereport(SimpleNamespace(nodeid=nodeid), call)
    next(hook)
    with pytest.raises(StopIteration):
        hook.send(SimpleNamespace(get_result=lambda: report))


def test_plugin_tells_an_assertion_from_an_error():
    o = mutants_plugin.Outcomes()
    _record(o, "conformance/test_golden.py::test_judged[a]", "call", "failed", AssertionError("out of tolerance"))
    _record(o, "conformance/test_golden.py::test_crashes[a]", "call", "failed", RuntimeError("kernel"))
    _record(o, "conformance/test_golden.py::test_fixture[a]", "setup", "failed", AssertionError("in a fixture"))
    _record(o, "conformance/test_golden.py::test_fine[a]", "setup", "passed")
    _record(o, "conformance/test_golden.py::test_fine[a]", "call", "passed")
    _record(o, "conformance/test_golden.py::test_fine[a]", "teardown", "passed")
    got = {k: v["outcome"] for k, v in o.checks.items()}
    assert got == {"judged[a]": "assertion", "crashes[a]": "error", "fixture[a]": "error", "fine[a]": "passed"}
    assert o.checks["crashes[a]"]["message"] == "RuntimeError: kernel"


def test_plugin_keeps_the_worst_phase():
    o = mutants_plugin.Outcomes()
    _record(o, "m.py::test_x", "call", "failed", AssertionError("judged"))
    _record(o, "m.py::test_x", "teardown", "failed", OSError("cleanup"))
    assert o.checks["x"]["outcome"] == "error"


def _checks(**outcomes: str) -> dict[str, dict]:
    return {name: {"outcome": o, "message": DRIFT_GUARD if name.startswith("drift") else ""}
            for name, o in outcomes.items()}


def test_verdict_counts_only_assertions_of_checks_the_baseline_passed():
    baseline = _checks(good="passed", broken="assertion", drift_guard="passed", crash="passed")
    mutant = _checks(good="assertion", broken="assertion", drift_guard="assertion", crash="error")
    catches, drift, errors = verdict(baseline, mutant)
    assert (catches, drift, errors) == (["good"], ["drift_guard"], ["crash"])


def test_verdict_catches_nothing_when_only_errors_or_the_baseline_failed():
    baseline = _checks(a="assertion", b="passed")
    assert verdict(baseline, _checks(a="assertion", b="error")) == ([], [], ["b"])
    assert verdict(baseline, {"suite": {"outcome": "error", "message": "exit status 2"}}) == ([], [], ["suite"])
