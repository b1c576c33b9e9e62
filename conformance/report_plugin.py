"""The conformance report's collector: each check's outcome, recorded errors and duration, written and printed at
the end of the run (``conformance.report``). Registered by ``conformance.plugin``; it records the suite's checks
alone.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conformance import report as report_mod
from conformance.plugin import NOT_SUPPORTED, backend_name, in_suite, report_stem


class ReportPlugin:
    """Collects each check's outcome, recorded errors and duration; writes and prints the report at the end.
    A run that did not run every check writes ``conformance-<backend>-partial``, never over the full report."""

    FILTERS = {"keyword": "-k", "markexpr": "-m", "lf": "--lf", "ignore": "--ignore", "ignore_glob": "--ignore-glob"}

    def __init__(self, config):
        self.config = config
        self.checks: dict[str, dict] = {}
        self.describe = ""
        self.selected = self.deselected = 0
        self.ours: set[str] = set()

    def pytest_sessionstart(self, session):
        self.start = time.perf_counter()

    def pytest_deselected(self, items):
        self.deselected += sum(in_suite(item.path) for item in items)

    def pytest_collection_finish(self, session):
        self.ours = {item.nodeid for item in session.items if in_suite(item.path)}
        self.selected = len(self.ours)

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(self, collector):
        report = yield
        if report.failed and in_suite(collector.path):  # a test module that does not import: else just missing
            self._outcome(f"collect[{collector.path.name}]", str(collector.path), report)
        return report

    def pytest_runtest_logreport(self, report):
        if report.passed and report.when != "call" or report.nodeid not in self.ours:
            return
        module, *_, func = report.nodeid.split("::")
        e = self._outcome(func.removeprefix("test_"), module, report)
        if report.when == "call":
            props = dict(report.user_properties)
            e.update(tensors=props.get("tensors", []), duration=report.duration)
            for key in ("agreement", "bf16_representable"):  # spec.agreement's observations, per tensor
                if key in props:
                    e[key] = props[key]

    def _outcome(self, name: str, module: str, report) -> dict:
        """The check's entry, its outcome the worst of its phases' (a skip or an error in setup or
        teardown counts too) with the message of the phase that decided it."""
        module = Path(module).name  # with --pyargs the node id may start with a site-packages path
        e = self.checks.setdefault(name, {"outcome": "passed", "message": "", "tensors": [], "duration": 0.0,
                                          "module": module, "family": report_mod.family_of(name, module)})
        outcome, message = report.outcome, _reason(report)
        if report.skipped and message.startswith(NOT_SUPPORTED):
            outcome = NOT_SUPPORTED
        if report_mod.OUTCOMES.index(outcome) > report_mod.OUTCOMES.index(e["outcome"]):
            e.update(outcome=outcome, message=message)
        return e

    def _filter(self) -> str:
        """What kept this run from running every check; empty for a full run."""
        o = self.config.option
        why = [flag if v is True else f"{flag} {v}"
               for key, flag in self.FILTERS.items() if (v := getattr(o, key, None))]
        # The suite itself is named by its folder, or by its package with --pyargs; a file or node id is a filter.
        why += [a for a in self.config.args if "::" in a or not (Path(a).is_dir() or a == "conformance")]
        why += [f"{self.deselected} deselected"] * bool(self.deselected)
        why += ["stopped early"] * (len(self.checks) < self.selected)
        return ", ".join(why)

    def pytest_terminal_summary(self, terminalreporter):
        if not self.checks:
            return
        backend, mutant = backend_name(self.config), self.config.getoption("--mutant")
        why = self._filter()
        rep = {"backend": backend if not mutant else f"{backend}+{mutant}", "describe": self.describe,
               "checks": self.checks, "python": sys.version.split()[0], "numpy": np.__version__,
               "duration_s": round(time.perf_counter() - self.start, 2), "partial": bool(why), "filter": why,
               "collected": self.selected + self.deselected}
        stem = report_stem(self.config) + "-partial" * rep["partial"]
        j, m = report_mod.write([rep], self.config.getoption("--report-dir"), stem)
        report_mod.show([rep])
        terminalreporter.write_line(f"report: {j} and {m}")


def _reason(report) -> str:
    """Why a check did not pass, on one line: the skip's reason, the exception's message, or (a module
    that does not import) the last line of pytest's report."""
    if isinstance(report.longrepr, tuple):  # a skip: (file, line, "Skipped: reason")
        return report.longrepr[2]
    crash = getattr(report.longrepr, "reprcrash", None)
    lines = [ln.strip() for ln in (crash.message if crash else report.longreprtext).splitlines() if ln.strip()]
    if crash is None:
        return lines[-1] if lines else ""
    # pytest's "assert ..." line only repeats the asserted expression after the message
    return " ".join(ln for ln in lines if not ln.startswith("assert ")).removeprefix("AssertionError: ")
