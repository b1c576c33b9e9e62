"""Steps as processes under a time budget, each one's outcome a record: ran, failed (with its error) or not reached
(with the reason), so that one part's failure never ends the run.

A step record: ``{"part", "name", "status", "reason", "seconds", "command", "log"}``; ``status`` is one of
``STATUSES``; ``reason`` says why a step failed or was not reached (None when it ran).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RAN, FAILED, NOT_REACHED = "ran", "failed", "not reached"
STATUSES = (RAN, FAILED, NOT_REACHED)
MIN_STEP_S = 3.0  # a step given less than this is not started: no framework even imports in less
ROOT = Path(__file__).resolve().parents[2]


def missing(*modules: str) -> str | None:
    """"NAME not installed" for the first of ``modules`` that cannot be imported here; None when all can."""
    for name in modules:
        if importlib.util.find_spec(name) is None:
            return f"{name} not installed"
    return None


def child_env(out: Path, device: str) -> dict[str, str]:
    """The steps' environment: this checkout first on the path, JAX's persistent compilation cache in ``out``
    (a rerun compiles nothing twice) and no preallocation of the GPU (torch and jax take turns on it); on the CPU,
    no GPU visible to either framework."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
               XLA_PYTHON_CLIENT_PREALLOCATE="false", JAX_COMPILATION_CACHE_DIR=str(out / "jax-cache"))
    if device == "cpu":
        env.update(JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
    return env


class Part:
    """One part's steps in order, the part ending at ``deadline`` (``time.monotonic`` seconds); a step's time
    limit is its ``weight``'s share of the time the part has left, so a later step keeps its share and whatever
    an earlier one did not use."""

    def __init__(self, name: str, out: Path, env: dict[str, str], deadline: float, weights: list[float]):
        self.name, self.out, self.env, self.deadline, self.weights = name, out, env, deadline, list(weights)
        self.records: list[dict[str, Any]] = []

    def skip(self, name: str, reason: str) -> dict[str, Any]:
        """Record the next step as not reached for ``reason``."""
        self.weights.pop(0)
        return self._record(name, NOT_REACHED, reason)

    def run(self, name: str, args: list[str]) -> dict[str, Any]:
        """Run ``python args...`` from the repository root, its output in ``<out>/<part>-<name>.log``; the record
        (its ``log`` names the file, for the caller to read results from)."""
        limit = (self.deadline - time.monotonic()) * self.weights[0] / sum(self.weights)
        if limit < MIN_STEP_S:
            return self.skip(name, f"time budget spent ({limit:.0f} s left for it)")
        self.weights.pop(0)
        log = self.out / f"{self.name}-{name}.log"
        cmd = [sys.executable, *args]
        start = time.monotonic()
        with log.open("wb") as f:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # its own process group: a timeout ends its children
            try:
                code = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                code = proc.wait()
                reason = f"time budget spent: stopped after {limit:.0f} s"
                return self._record(name, NOT_REACHED, reason, start, cmd, log)
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        if code:
            return self._record(name, FAILED, f"exit status {code}: " + "\n".join(tail), start, cmd, log)
        return self._record(name, RAN, None, start, cmd, log)

    def _record(self, name: str, status: str, reason: str | None, start: float | None = None,
                cmd: list[str] | None = None, log: Path | None = None) -> dict[str, Any]:
        rec = {"part": self.name, "name": name, "status": status, "reason": reason,
               "seconds": None if start is None else round(time.monotonic() - start, 1),
               "command": None if cmd is None else " ".join(["python", *cmd[1:]]),
               "log": None if log is None else log.name}
        self.records.append(rec)
        return rec
