"""The conformance suite as a pytest plugin (entry point ``aiayn_conformance``): its options, the backend under
test, the "not supported" outcome and the report.

    pytest --pyargs conformance --backend reference      # or torch, jax, tf, or mypkg.adapter (its make_backend())

Installed, the plugin is loaded by every pytest run of the environment; it acts only on the suite's own checks (the
test files of this package), so another project's run sees its options and nothing else: no report, no fixture.
Run from a checkout where the suite is not installed, ``conformance/conftest.py`` registers it.
"""

from __future__ import annotations

import functools
import importlib
import re
from pathlib import Path

import pytest

from conformance.adapters.base import NotSupported

SUITE = Path(__file__).resolve().parent
NOT_SUPPORTED = "not supported"  # the outcome, and the start of the skip reason that carries it


def pytest_addoption(parser):
    g = parser.getgroup("conformance")
    g.addoption("--backend", default=None,
                help="backend under test: reference, torch, jax, tf, or the import path of a module defining "
                     "make_backend() (default: reference)")
    g.addoption("--report-dir", default="reports", type=Path, help="where the JSON/Markdown report goes")
    g.addoption("--mutant", default=None, help="test a mutant of the reference (see conformance.mutants)")
    g.addoption("--data-parallel", action="store_true",
                help="run only the data-parallel checks (test_data_parallel.py), which no other run collects")


def backend_name(config) -> str:
    """The --backend given, or the reference."""
    return config.getoption("--backend", default=None) or "reference"


def report_stem(config) -> str:
    """``conformance-<backend>[+<mutant>]`` with what a file name should not hold (a path's slashes) as ``_``."""
    mutant = config.getoption("--mutant", default=None)
    return "conformance-" + re.sub(r"[^\w.+-]", "_", backend_name(config) + (f"+{mutant}" if mutant else ""))


@functools.cache
def backend_module(name: str):
    """The module whose ``make_backend()`` builds backend ``name``: a built-in backend's adapter
    (``conformance.adapters.backend_<name>``) or the module of that import path; a pytest UsageError names it when
    it does not import or defines no ``make_backend``."""
    from spec.api import BACKENDS
    path = f"conformance.adapters.backend_{name}" if name in ("reference", *BACKENDS) else name
    try:
        module = importlib.import_module(path)
    except ImportError as e:
        raise pytest.UsageError(f"--backend {name}: neither a built-in backend (reference, {', '.join(BACKENDS)}) "
                                f"nor an importable module: {type(e).__name__}: {e}") from None
    if not callable(getattr(module, "make_backend", None)):
        raise pytest.UsageError(f"--backend {name}: module {module.__name__} defines no make_backend()")
    return module


def pytest_configure(config):
    config.addinivalue_line("markers", "needs(*capabilities): the check runs only on a backend that supports these "
                                       "(conformance.adapters.base.CAPABILITIES); otherwise it is not supported")
    from conformance.report_plugin import ReportPlugin
    config._conformance = ReportPlugin(config)
    config.pluginmanager.register(config._conformance, "conformance-report")
    mutant, given = config.getoption("--mutant"), config.getoption("--backend")
    if mutant:  # before the backend's module imports the reference
        from conformance import mutants
        if backend_name(config) != "reference":
            raise pytest.UsageError("--mutant applies to --backend reference only")
        mutants.apply(mutant)
    if config.getoption("--data-parallel") and backend_name(config) == "reference":
        raise pytest.UsageError("--data-parallel needs an impl's engine: --backend torch, jax or tf")
    if given:
        backend_module(given)


@functools.cache
def in_suite(path: Path) -> bool:
    """Whether ``path`` (a test file or folder) is part of the suite, which the plugin's hooks alone act on."""
    resolved = Path(path).resolve()
    return resolved == SUITE or SUITE in resolved.parents


def pytest_ignore_collect(collection_path, config):
    """The common-API checks ask an impl module; the reference backend is the spec itself. The data-parallel
    checks (minutes of processes) run apart: alone with --data-parallel, never without it."""
    if not in_suite(collection_path.parent):
        return None
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        if (collection_path.name == "test_data_parallel.py") != bool(config.getoption("--data-parallel")):
            return True
    return collection_path.name == "test_api.py" and backend_name(config) == "reference" or None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A check of the suite that raised ``NotSupported`` (the adapter's, or the suite's for a capability the backend
    lacks) in any phase is skipped, its reason starting with "not supported"; the report counts it apart."""
    report = yield
    if in_suite(item.path) and call.excinfo is not None and call.excinfo.errisinstance(NotSupported):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"{NOT_SUPPORTED}: {call.excinfo.value}")
    return report
