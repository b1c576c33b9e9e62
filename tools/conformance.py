"""The conformance suite on several backends at once, one pytest process each, with progress per backend.

    python -m tools.conformance --report-dir reports/run                 # every backend
    python -m tools.conformance --report-dir reports/run jax tf -- -x    # some backends; pytest options after --

Each backend runs ``pytest --pyargs conformance --backend NAME`` in its own process (the backends share nothing
but the CPU), at most ``--jobs`` at a time (default: the CPU count), the slowest first so that the run ends
soonest. A line per backend shows its share of checks done and an estimate of the time left; each pytest's
output goes to ``<report-dir>/pytest-NAME.log``, and a failed backend's log tail is printed. Exit status 1 when a
backend fails.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from spec.api import BACKENDS as IMPLS
from spec.data_parallel_cli import HelpFormatter

BACKENDS = (*reversed(IMPLS), "reference")  # the slowest first: tf, jax, torch, then the reference
PERCENT = re.compile(rb"\[\s*(\d+)%\]")


def _start(backend: str, out: Path, pytest_args: list[str]) -> tuple[subprocess.Popen, Path]:
    log = out / f"pytest-{backend}.log"
    # pytest's script, not ``python -m pytest``: -m would put the working directory first on sys.path, and a run
    # from the repository would test its sources instead of the installed packages.
    script = Path(sys.executable).with_name("pytest")
    pytest = [str(script)] if script.exists() else [sys.executable, "-m", "pytest"]
    out = out.resolve()
    cmd = [*pytest, "--pyargs", "conformance", "--backend", backend, "--report-dir", str(out), "-p", "no:cacheprovider",
           *pytest_args]
    # Run from the report folder: from the repository, pytest would also load the checkout's conformance/conftest.py
    # beside the installed package's, which the installed plugin has already imported (ImportPathMismatchError).
    with log.open("wb") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=out), log


def _progress(log: Path) -> int:
    """The last percentage pytest printed (0 before the first line of dots)."""
    found = PERCENT.findall(log.read_bytes()) if log.exists() else []
    return int(found[-1]) if found else 0


def _line(running: dict[str, tuple[subprocess.Popen, Path, float]], now: float) -> str:
    parts = []
    for backend, (_, log, t0) in running.items():
        pct, spent = _progress(log), now - t0
        eta = f", ~{spent * (100 - pct) / pct:.0f} s left" if pct else ""
        parts.append(f"{backend} {pct}% ({spent:.0f} s{eta})")
    return "  ".join(parts)


def run(backends: list[str], out: Path, jobs: int, pytest_args: list[str], every: float = 20.0) -> int:
    """Run the suite for ``backends``, ``jobs`` at a time; the number of backends that failed."""
    out.mkdir(parents=True, exist_ok=True)
    waiting, running, failed, t_start, shown = list(backends), {}, [], time.monotonic(), 0.0
    while waiting or running:
        while waiting and len(running) < jobs:
            backend = waiting.pop(0)
            proc, log = _start(backend, out, pytest_args)
            running[backend] = (proc, log, time.monotonic())
        time.sleep(1.0)
        now = time.monotonic()
        for backend, (proc, log, t0) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[backend]
            summary = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            print(f"[{now - t_start:4.0f} s] {backend}: {'passed' if proc.returncode == 0 else 'FAILED'} in "
                  f"{now - t0:.0f} s: {summary[0].strip('= ')}", flush=True)
            if proc.returncode != 0:
                failed.append(backend)
                print("\n".join(log.read_text(errors="replace").splitlines()[-60:]), flush=True)
        if running and now - shown >= every:
            print(f"[{now - t_start:4.0f} s] {_line(running, now)}", flush=True)
            shown = now
    print(f"conformance: {len(backends) - len(failed)} of {len(backends)} backends passed in "
          f"{time.monotonic() - t_start:.0f} s" + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    return len(failed)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, pytest_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(prog="python -m tools.conformance", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("backends", nargs="*", metavar="BACKEND", help=f"of {', '.join(BACKENDS)} (default: all)")
    p.add_argument("--report-dir", type=Path, required=True, help="where the reports and pytest logs go")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="backends run at once")
    a = p.parse_args(ours)
    unknown = sorted(set(a.backends) - set(BACKENDS))
    if unknown:
        p.error(f"unknown backend {', '.join(unknown)}; the backends are {', '.join(BACKENDS)}")
    backends = [b for b in BACKENDS if b in (a.backends or BACKENDS)]
    return 1 if run(backends, a.report_dir, max(1, a.jobs), pytest_args) else 0


if __name__ == "__main__":
    sys.exit(main())
