"""Sessions: conformance (per backend, then one combined report), tests, mutants, golden, lint.

    nox -s conformance                              # every backend that has an adapter
    nox -s "conformance(backend='reference')"       # one backend
    nox -s tests mutants lint
    nox -s golden                                   # rewrite spec/golden
    nox -s golden -- --check                        # regenerate in a temp dir, compare bit for bit
"""

from __future__ import annotations

import time
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
CONSTRAINTS = ("-c", str(ROOT / "constraints.txt"))
# A backend exists once the conformance suite has an adapter for it.
BACKENDS = [b for b in ("reference", "torch", "jax", "tf") if (ROOT / f"conformance/adapters/backend_{b}.py").exists()]
PACKAGES = {"reference": [], "torch": ["./impl_torch"], "jax": ["./impl_jax"], "tf": ["./impl_tf"]}
# One folder per nox invocation, so the combined report shows this run's backends only.
REPORTS = ROOT / "reports" / time.strftime("%Y%m%d-%H%M%S")

nox.options.sessions = ["conformance"]


@nox.session
@nox.parametrize("backend", BACKENDS)
def conformance(session: nox.Session, backend: str) -> None:
    """The conformance suite for one backend, in a virtualenv holding only that backend's framework."""
    session.install(*CONSTRAINTS, "./spec", "./conformance", *PACKAGES[backend])
    session.notify("report")
    # --pyargs runs the installed suite against the installed packages, so packaging mistakes show.
    session.run("pytest", "--pyargs", "conformance", "--backend", backend, "--report-dir", str(REPORTS),
                "-p", "no:cacheprovider", *session.posargs)


@nox.session
def report(session: nox.Session) -> None:
    """The combined table of every backend run by this nox invocation."""
    files = sorted(REPORTS.glob("conformance-*.json"))
    if not files:
        session.skip("no conformance report from this run")
    session.install("rich")
    session.run("python", "conformance/report.py", *map(str, files), "--out", str(REPORTS))


@nox.session
@nox.parametrize("package", ["spec", *[f"impl_{b}" for b in BACKENDS if b != "reference"]])
def tests(session: nox.Session, package: str) -> None:
    """Unit tests of one package, in a virtualenv holding that package and its dependencies."""
    session.install(*CONSTRAINTS, f"./{package}", "pytest", "hypothesis")
    session.run("pytest", f"{package}/tests", "-p", "no:cacheprovider", *session.posargs)


@nox.session
def mutants(session: nox.Session) -> None:
    """Every mutant of the reference must fail the conformance suite; prints which checks caught each."""
    session.install(*CONSTRAINTS, "./spec", "./conformance")
    session.run("python", "-m", "conformance.mutants", "--report-dir", str(REPORTS / "mutants"), *session.posargs)


@nox.session
def golden(session: nox.Session) -> None:
    """Write spec/golden; with `-- --check`, regenerate in a temp dir and compare bit for bit."""
    session.install(*CONSTRAINTS, "./spec")
    session.run("python", "-m", "spec.golden_cases", "--out", str(ROOT / "spec" / "golden"), *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")
