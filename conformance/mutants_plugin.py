"""A pytest plugin for the mutation test (``conformance.mutants``): what failed each check, an assertion or an error.

    python -m pytest --pyargs conformance -p conformance.mutants_plugin ...

writes ``outcomes-<backend>[+<mutant>].json`` in ``--report-dir``: {check: {"outcome", "message"}}, the outcome
"passed", "skipped", "assertion" (an ``AssertionError`` raised by the check itself: its judgement failed) or
"error" (any other exception, in the check or its fixtures, or a test module that does not collect), the worst of
the check's phases. Checks are named as the conformance report names them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.plugin import backend_name

RANK = ("passed", "skipped", "assertion", "error")


class _Outcomes:
    def __init__(self):
        self.checks: dict[str, dict] = {}

    def add(self, check: str, outcome: str, message: str) -> None:
        e = self.checks.setdefault(check, {"outcome": "passed", "message": ""})
        if RANK.index(outcome) > RANK.index(e["outcome"]):
            e.update(outcome=outcome, message=message)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = (yield).get_result()
        check = item.nodeid.split("::")[-1].removeprefix("test_")
        if report.failed:
            asserted = call.when == "call" and call.excinfo is not None and call.excinfo.errisinstance(AssertionError)
            self.add(check, "assertion" if asserted else "error", _message(call))
        elif report.when == "call" or report.skipped:
            self.add(check, report.outcome, "")

    def pytest_collectreport(self, report):
        if report.failed:
            self.add(f"collect[{Path(report.nodeid).name}]", "error", report.longreprtext.strip()[-300:])


def _message(call) -> str:
    """The exception's type and message on one line, cut to 300 characters, without the asserted expression that
    pytest appends."""
    if call.excinfo is None:
        return ""
    lines = [ln.strip() for ln in str(call.excinfo.value).splitlines()]
    text = " ".join(ln for ln in lines if ln and not ln.startswith("assert "))
    return f"{call.excinfo.typename}: {text}"[:300]


def pytest_configure(config):
    config._mutants_outcomes = _Outcomes()
    config.pluginmanager.register(config._mutants_outcomes, "mutants-outcomes")


def pytest_unconfigure(config):
    outcomes = getattr(config, "_mutants_outcomes", None)
    if outcomes is None:
        return
    mutant = config.getoption("--mutant", default=None)
    name = backend_name(config) + (f"+{mutant}" if mutant else "")
    out = Path(config.getoption("--report-dir"))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"outcomes-{name}.json").write_text(json.dumps(outcomes.checks, indent=1, sort_keys=True))
