"""Pytest wiring of the conformance suite: the --backend option, fixtures, and the report.

    python -m pytest conformance --backend reference      # or torch, jax, tf
"""

from __future__ import annotations

import importlib
import sys
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


def pytest_configure(config):
    config._conformance = ReportPlugin(config)
    config.pluginmanager.register(config._conformance, "conformance-report")
    mutant = config.getoption("--mutant", default=None)
    if mutant:
        from conformance import mutants
        if config.getoption("--backend") != "reference":
            raise pytest.UsageError("--mutant applies to --backend reference only")
        mutants.apply(mutant)


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
    return lambda case: load_model(*golden_cases.case_params(case.meta))


@pytest.fixture
def record(record_property):
    """``record(verdicts)``: attach each judged tensor's errors to the report, then assert them all."""

    def rec(verdicts: dict[str, tolerance.Verdict]) -> None:
        rows = [{"tensor": n, "ok": v.ok, "ratio": v.ratio, "allowed_eps": v.max_eps_allowed, **v.stats.to_dict()}
                for n, v in verdicts.items()]
        record_property("tensors", rows)
        bad = [f"{n}: {v.reason()}" for n, v in verdicts.items() if not v.ok]
        assert not bad, "out of tolerance:\n  " + "\n  ".join(bad)

    return rec


class ReportPlugin:
    """Collects each check's outcome and recorded errors; writes and prints the report at the end."""

    def __init__(self, config):
        self.config = config
        self.checks: dict[str, dict] = {}
        self.describe = ""

    def pytest_runtest_logreport(self, report):
        name = report.nodeid.split("::")[-1].removeprefix("test_")
        if report.when == "call":
            self.checks[name] = {"outcome": report.outcome, "tensors": dict(report.user_properties).get("tensors", []),
                                 "message": _last_line(report) if report.failed else ""}
        elif report.outcome != "passed":  # an error in setup or teardown counts as a failure
            self.checks.setdefault(name, {"tensors": [], "message": _last_line(report)})["outcome"] = "failed"

    def pytest_terminal_summary(self, terminalreporter):
        if not self.checks:
            return
        backend, mutant = self.config.getoption("--backend"), self.config.getoption("--mutant")
        rep = {"backend": backend if not mutant else f"{backend}+{mutant}", "describe": self.describe,
               "checks": self.checks, "python": sys.version.split()[0], "numpy": np.__version__}
        j, m = report_mod.write([rep], self.config.getoption("--report-dir"), f"conformance-{rep['backend']}")
        report_mod.show([rep])
        terminalreporter.write_line(f"report: {j} and {m}")


def _last_line(report) -> str:
    lines = [ln for ln in report.longreprtext.splitlines() if ln.strip()]
    return lines[-1] if lines else ""
