"""The conformance suite on several backends at once, one pytest process each, with progress per backend.

    python -m tools.conformance --report-dir reports/run                 # every backend
    python -m tools.conformance --report-dir reports/run jax tf -- -x    # some backends; pytest options after --

Each backend runs ``pytest --pyargs conformance --backend NAME`` in its own process (the backends share nothing
but the CPU), jax and tf (the slowest, by their compiles) as two processes each, one per shard of the suite
(``--shard``: the golden cases, the other checks), whose reports are merged into the backend's
(``conformance.report.merge``). At most ``--jobs`` processes run at a time (default: the CPU count), the longest
first so that the run ends soonest, each with the CPU count / ``--jobs`` intra-op threads. A line per process
shows its share of checks done and an estimate of the time left; each pytest's output goes to
``<report-dir>/pytest-NAME.log`` (NAME ``tf.golden`` for a shard), and a failed process's log tail is printed. Exit
status 1 when a backend fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from conformance.plugin import SHARDS
from conformance.report import merge, write
from spec.api import BACKENDS as IMPLS
from spec.data_parallel_cli import HelpFormatter

BACKENDS = (*reversed(IMPLS), "reference")  # the slowest first: tf, jax, torch, then the reference
SPLIT = ("tf", "jax")  # run as one process per shard: each takes minutes of compiles, so two cores share them
PERCENT = re.compile(rb"\[\s*(\d+)%\]")


def jobs_of(backends: list[str], pytest_args: list[str]) -> list[tuple[str, str | None]]:
    """(backend, shard or None) per process, the longest first: each shard of tf, of jax (measured: the two about
    as long, tf's longer than jax's), then torch, then the reference. With pytest options (a filter, ``-x``) every
    backend runs whole: a filter could leave a shard nothing to run."""
    return [(b, s) for b in backends for s in (SHARDS if b in SPLIT and not pytest_args else [None])]


def _name(backend: str, shard: str | None) -> str:
    return f"{backend}.{shard}" if shard else backend


def threads_env(threads: int) -> dict[str, str]:
    """The environment of a process given ``threads`` cores: each framework's intra-op threads (torch's OpenMP,
    TensorFlow's pools, XLA's CPU runtime) set to that many, so processes sharing the cores do not also fight over
    them (a thread spinning on a core another process holds slows torch many times)."""
    xla = f"--xla_cpu_multi_thread_eigen={str(threads > 1).lower()} intra_op_parallelism_threads={threads}"
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "TF_NUM_INTRAOP_THREADS": str(threads),
            "TF_NUM_INTEROP_THREADS": str(threads), "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {xla}".strip()}


def _start(backend: str, shard: str | None, out: Path, pytest_args: list[str], threads: int
           ) -> tuple[subprocess.Popen, Path]:
    log = out / f"pytest-{_name(backend, shard)}.log"
    # pytest's script, not ``python -m pytest``: -m would put the working directory first on sys.path, and a run
    # from the repository would test its sources instead of the installed packages.
    script = Path(sys.executable).with_name("pytest")
    pytest = [str(script)] if script.exists() else [sys.executable, "-m", "pytest"]
    out, reports = out.resolve(), (out / "shards" if shard else out).resolve()  # a shard's report: merged later
    cmd = [*pytest, "--pyargs", "conformance", "--backend", backend, "--report-dir", str(reports),
           "-p", "no:cacheprovider", *(["--shard", shard] if shard else []), *pytest_args]
    # Run from the report folder: from the repository, pytest would also load the checkout's conformance/conftest.py
    # beside the installed package's, which the installed plugin has already imported (ImportPathMismatchError).
    with log.open("wb") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=out, env=threads_env(threads)), log


def _progress(log: Path) -> int:
    """The last percentage pytest printed (0 before the first line of dots)."""
    found = PERCENT.findall(log.read_bytes()) if log.exists() else []
    return int(found[-1]) if found else 0


def _line(running: dict[str, tuple[subprocess.Popen, Path, float, str]], now: float) -> str:
    parts = []
    for name, (_, log, t0, _) in running.items():
        pct, spent = _progress(log), now - t0
        eta = f", ~{spent * (100 - pct) / pct:.0f} s left" if pct else ""
        parts.append(f"{name} {pct}% ({spent:.0f} s{eta})")
    return "  ".join(parts)


def run(backends: list[str], out: Path, jobs: int, pytest_args: list[str], every: float = 20.0) -> int:
    """Run the suite for ``backends``, ``jobs`` processes at a time; the number of backends that failed."""
    out.mkdir(parents=True, exist_ok=True)
    waiting, running, failed, t_start, shown = jobs_of(backends, pytest_args), {}, set(), time.monotonic(), 0.0
    left = {b: sum(j[0] == b for j in waiting) for b in backends}  # processes of each backend still to end
    while waiting or running:
        while waiting and len(running) < jobs:
            backend, shard = waiting.pop(0)
            proc, log = _start(backend, shard, out, pytest_args, max(1, (os.cpu_count() or 1) // jobs))
            running[_name(backend, shard)] = (proc, log, time.monotonic(), backend)
        time.sleep(1.0)
        now = time.monotonic()
        for name, (proc, log, t0, backend) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[name]
            summary = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            print(f"[{now - t_start:4.0f} s] {name}: {'passed' if proc.returncode == 0 else 'FAILED'} in "
                  f"{now - t0:.0f} s: {summary[0].strip('= ')}", flush=True)
            if proc.returncode != 0:
                failed.add(backend)
                print("\n".join(log.read_text(errors="replace").splitlines()[-60:]), flush=True)
            left[backend] -= 1
            if not left[backend] and backend in SPLIT and not pytest_args and not merge_shards(backend, out):
                failed.add(backend)
        if running and now - shown >= every:
            print(f"[{now - t_start:4.0f} s] {_line(running, now)}", flush=True)
            shown = now
    print(f"conformance: {len(backends) - len(failed)} of {len(backends)} backends passed in "
          f"{time.monotonic() - t_start:.0f} s" + (f"; failed: {', '.join(sorted(failed))}" if failed else ""),
          flush=True)
    return len(failed)


def merge_shards(backend: str, out: Path) -> bool:
    """The backend's report (``conformance-<backend>``) from its shards' in ``out/shards``; False (and why) if a
    shard wrote none."""
    files = [out / "shards" / f"conformance-{backend}.{shard}-partial.json" for shard in SHARDS]
    if not all(f.exists() for f in files):
        print(f"{backend}: no report from {', '.join(f.name for f in files if not f.exists())}", flush=True)
        return False
    report = merge([json.loads(f.read_text()) for f in files], list(SHARDS))
    j, _ = write([report], out, f"conformance-{backend}" + "-partial" * report["partial"])
    print(f"{backend}: report {j} ({len(report['checks'])} checks from {len(files)} shards)", flush=True)
    return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, pytest_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(prog="python -m tools.conformance", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("backends", nargs="*", metavar="BACKEND", help=f"of {', '.join(BACKENDS)} (default: all)")
    p.add_argument("--report-dir", type=Path, required=True, help="where the reports and pytest logs go")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="pytest processes run at once")
    a = p.parse_args(ours)
    unknown = sorted(set(a.backends) - set(BACKENDS))
    if unknown:
        p.error(f"unknown backend {', '.join(unknown)}; the backends are {', '.join(BACKENDS)}")
    backends = [b for b in BACKENDS if b in (a.backends or BACKENDS)]
    return 1 if run(backends, a.report_dir, max(1, a.jobs), pytest_args) else 0


if __name__ == "__main__":
    sys.exit(main())
