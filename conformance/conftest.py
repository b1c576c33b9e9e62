"""Pytest wiring of the conformance suite: the --backend option, fixtures, and the report.

    python -m pytest conformance --backend reference      # or torch, jax, tf
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conformance import report as report_mod
from spec import golden_cases, tolerance
from spec.weights_io import save_weights

BACKENDS = ("reference", "torch", "jax", "tf")


def pytest_addoption(parser):
    g = parser.getgroup("conformance")
    g.addoption("--backend", default="reference", choices=BACKENDS, help="backend under test")
    g.addoption("--report-dir", default="reports", type=Path, help="where the JSON/Markdown report goes")
    g.addoption("--mutant", default=None, help="test a mutant of the reference (see conformance.mutants)")
    g.addoption("--data-parallel", action="store_true",
                help="run only the data-parallel checks (test_data_parallel.py), which no other run collects")


def pytest_configure(config):
    config._conformance = ReportPlugin(config)
    config.pluginmanager.register(config._conformance, "conformance-report")
    mutant = config.getoption("--mutant", default=None)
    if mutant:
        from conformance import mutants
        if config.getoption("--backend") != "reference":
            raise pytest.UsageError("--mutant applies to --backend reference only")
        mutants.apply(mutant)
    if config.getoption("--data-parallel") and config.getoption("--backend") == "reference":
        raise pytest.UsageError("--data-parallel needs an impl's engine: --backend torch, jax or tf")


def pytest_ignore_collect(collection_path, config):
    """The common-API checks ask an impl module; the reference backend is the spec itself. The data-parallel
    checks (minutes of processes) run apart: alone with --data-parallel, never without it."""
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        if (collection_path.name == "test_data_parallel.py") != bool(config.getoption("--data-parallel")):
            return True
    return collection_path.name == "test_api.py" and config.getoption("--backend") == "reference" or None


@pytest.fixture(scope="session")
def backend(request):
    name = request.config.getoption("--backend")
    b = importlib.import_module(f"conformance.adapters.backend_{name}").make_backend()
    request.config._conformance.describe = b.describe()
    return b


@pytest.fixture(scope="session")
def load_model(backend, tmp_path_factory):
    """``load_model(config, params)``: the backend's model from a canonical weights file, cached."""
    cache = {}

    def load(config, params):
        key = (config.to_json(), golden_cases.params_digest(params))
        if key not in cache:
            path = tmp_path_factory.mktemp("weights") / "model.safetensors"
            save_weights(path, config, params)
            cache[key] = backend.load(path)
        return cache[key]

    return load


@pytest.fixture(scope="session")
def model_for(load_model):
    """``model_for(case)``: the backend's model with a golden case's weights."""
    return lambda case: load_model(*golden_cases.case_params(case.meta, case.params))


@pytest.fixture
def record(record_property):
    """``record(verdicts)``: attach each judged tensor's errors to the report, then assert them all."""

    def rec(verdicts: dict[str, tolerance.Verdict]) -> None:
        rows = [{"tensor": n, "ok": v.ok, "ratio": v.ratio, "allowed_eps": v.max_eps_allowed,
                 "allowed_rms_eps": v.rms_eps_allowed, **v.stats.to_dict()} for n, v in verdicts.items()]
        record_property("tensors", rows)
        bad = [f"{n}: {v.reason()}" for n, v in verdicts.items() if not v.ok]
        assert not bad, "out of tolerance:\n  " + "\n  ".join(bad)

    return rec


class ReportPlugin:
    """Collects each check's outcome, recorded errors and duration; writes and prints the report at the end.
    A run that did not run every check writes ``conformance-<backend>-partial``, never over the full report."""

    FILTERS = {"keyword": "-k", "markexpr": "-m", "lf": "--lf", "ignore": "--ignore", "ignore_glob": "--ignore-glob"}

    def __init__(self, config):
        self.config = config
        self.checks: dict[str, dict] = {}
        self.describe = ""
        self.selected = self.deselected = 0

    def pytest_sessionstart(self, session):
        self.start = time.perf_counter()

    def pytest_deselected(self, items):
        self.deselected += len(items)

    def pytest_collection_finish(self, session):
        self.selected = len(session.items)

    def pytest_collectreport(self, report):
        if report.failed:  # a test module that does not import would otherwise just be missing from the report
            self._outcome(f"collect[{Path(report.nodeid).name}]", report.nodeid, report)

    def pytest_runtest_logreport(self, report):
        if report.passed and report.when != "call":
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
        rank = ("passed", "skipped", "failed").index
        if rank(report.outcome) > rank(e["outcome"]):
            e.update(outcome=report.outcome, message=_reason(report))
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
        backend, mutant = self.config.getoption("--backend"), self.config.getoption("--mutant")
        why = self._filter()
        rep = {"backend": backend if not mutant else f"{backend}+{mutant}", "describe": self.describe,
               "checks": self.checks, "python": sys.version.split()[0], "numpy": np.__version__,
               "duration_s": round(time.perf_counter() - self.start, 2), "partial": bool(why), "filter": why,
               "collected": self.selected + self.deselected}
        stem = f"conformance-{rep['backend']}" + "-partial" * rep["partial"]
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
