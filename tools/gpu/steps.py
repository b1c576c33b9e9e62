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
GRACE = 0.1       # the share of a step's time kept for it to stop when interrupted (pytest then writes its report)
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
    """One part's steps in order, the part ending at ``deadline`` (``time.monotonic`` seconds)."""

    def __init__(self, name: str, out: Path, env: dict[str, str], deadline: float):
        self.name, self.out, self.env, self.deadline = name, out, env, deadline
        self.records: list[dict[str, Any]] = []

    def run_all(self, plan: list[tuple[str, list[str] | str, float]]) -> list[dict[str, Any]]:
        """Each (name, ``python`` arguments or why it cannot run, weight) of ``plan`` in order; the records. A step's
        time limit is its weight's share of the time the part has left among the steps that can run, so a later
        step keeps its share and whatever an earlier one did not use."""
        left = sum(w for _, what, w in plan if isinstance(what, list))
        for name, what, weight in plan:
            if isinstance(what, str):
                self._record(name, NOT_REACHED, what)
                continue
            self._run(name, what, (self.deadline - time.monotonic()) * weight / left)
            left -= weight
        return self.records

    def _run(self, name: str, args: list[str], limit: float) -> None:
        """``python args...`` from the repository root for at most ``limit`` seconds, its output in
        ``<out>/<part>-<name>.log`` (the record's ``log``, for the caller to read results from)."""
        if limit < MIN_STEP_S:
            self._record(name, NOT_REACHED, f"time budget spent ({limit:.0f} s left for it)")
            return
        log = self.out / f"{self.name}-{name}.log"
        cmd = [sys.executable, *args]
        start = time.monotonic()
        with log.open("wb") as f:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # its own process group: a timeout ends its children
            try:
                code = proc.wait(timeout=limit * (1 - GRACE))
            except subprocess.TimeoutExpired:
                _stop(proc, limit * GRACE)
                self._record(name, NOT_REACHED, f"time budget spent: stopped after {limit:.0f} s", start, cmd, log)
                return
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        self._record(name, FAILED if code else RAN, f"exit status {code}: " + "\n".join(tail) if code else None,
                     start, cmd, log)

    def _record(self, name: str, status: str, reason: str | None, start: float | None = None,
                cmd: list[str] | None = None, log: Path | None = None) -> None:
        self.records.append({"part": self.name, "name": name, "status": status, "reason": reason,
                             "seconds": None if start is None else round(time.monotonic() - start, 1),
                             "command": None if cmd is None else " ".join(["python", *cmd[1:]]),
                             "log": None if log is None else log.name})


def _stop(proc: subprocess.Popen, grace_s: float) -> None:
    """Interrupt the process group (a pytest in it writes the report of what it reached), wait up to ``grace_s``
    seconds for every process of the group to end, then kill what is left."""
    os.killpg(proc.pid, signal.SIGINT)
    end = time.monotonic() + grace_s
    while _alive(proc) and time.monotonic() < end:
        time.sleep(0.2)
    if _alive(proc):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _alive(proc: subprocess.Popen) -> bool:
    """Whether any process of ``proc``'s group (its children too) is still running."""
    proc.poll()  # reaps the group's leader once it has ended
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    return True
