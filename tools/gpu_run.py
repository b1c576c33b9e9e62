"""The project on a GPU in one command: the conformance suite, the bench's speed as a share of the chip's peak, and
decoding against the peers; a report of what ran, what failed and what was not reached.

    PYTHONPATH=$PWD python -m tools.gpu_run --out reports/gpu                # on the GPU: full sizes
    PYTHONPATH=$PWD python -m tools.gpu_run --out /tmp/g --device cpu --size tiny --budget-s 80   # a CPU's smoke run

From a checkout whose Python already holds torch and jax (nothing is installed). In order, each part given its
share of ``--budget-s`` and whatever the parts before it left:

- conformance: the whole suite for jax, then torch (``tools.conformance``; JAX's compilation cache in
  ``<out>/jax-cache``, so a rerun compiles nothing twice);
- bench: the bf16 forward and mixed training step at ``base`` and ``big``, ours against the framework's stock peer
  (``torch.nn.Transformer`` with autocast, Flax), in TFLOP/s (``spec.flops``) and as a share of the chip's dense
  bf16 peak (``tools.gpu.speed``);
- decode: translation greedy and beam at B = 32, ours and Hugging Face's Marian, and generation at gpt2_small, ours
  and transformers' GPT-2 (``bench.run --workloads lm``).

Every step is a process of its own; one that fails or runs out of time is recorded (its error, or why it was not
reached) and the run goes on. Writes ``<out>/gpu-run.md`` and ``<out>/gpu-run.json``, each step's log beside them.
Exit status 1 when a step failed.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import machine  # the bench's record of the host: CPU model, cores, memory, SIMD
from spec.data_parallel_cli import HelpFormatter
from tools.gpu import parts, report, speed
from tools.gpu.steps import FAILED, Part, child_env

PARTS = ("conformance", "bench", "decode")
# Each part's share of the time left when it starts, among the parts left (tiny: the frameworks' imports dominate).
SHARES = {"full": {"conformance": 0.55, "bench": 0.25, "decode": 0.20},
          "tiny": {"conformance": 0.2, "bench": 0.3, "decode": 0.5}}
PACKAGES = ("torch", "jax", "jaxlib", "flax", "optax", "transformers", "numpy")


def environment(device: str) -> dict[str, Any]:
    """The versions of the packages this Python holds (never importing them), the device's name, the CPU and the
    date."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    host = machine()
    return {"versions": versions, "device_name": _device_name(device), "cpu": host["cpu"], "machine": host,
            "python": host["python"], "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def _device_name(device: str) -> str:
    """The GPU's name as torch reports it ("cpu" on the CPU); a run without a usable GPU still reports."""
    if device == "cpu":
        return "cpu"
    try:
        import torch
        return torch.cuda.get_device_name()
    except (ImportError, RuntimeError, AssertionError) as e:  # no torch, no driver, a CPU build
        return f"unknown ({type(e).__name__}: {e})"


def run(out: Path, device: str, size: str, budget_s: float, only: list[str]) -> dict[str, Any]:
    """Every part in ``only`` in order within ``budget_s`` seconds; the report (``tools.gpu.report``)."""
    start = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    env, environ = child_env(out, device), environment(device)
    peak, note = speed.peak_bf16(environ["device_name"])
    steps, records, decoded = [], [], []
    for i, name in enumerate(only):
        left = budget_s - (time.monotonic() - start)
        share = SHARES[size][name] / sum(SHARES[size][n] for n in only[i:])
        part = Part(name, out, env, time.monotonic() + left * share)
        print(f"gpu_run: {name} ({left * share:.0f} s)", flush=True)
        if name == "conformance":
            parts.conformance(part, size)
        elif name == "bench":
            records = parts.bench(part, device, size)
        else:
            decoded = parts.decode(part, device, size)
        for s in part.records:
            print(f"  {s['name']}: {s['status']}" + (f" ({s['reason'].splitlines()[0]})" if s["reason"] else ""),
                  flush=True)
        steps += part.records
    not_run = [{"part": n, "name": "all", "status": "not reached", "reason": "not asked for (--parts)", "seconds": None,
                "command": None, "log": None} for n in PARTS if n not in only]
    return {"environment": environ, "options": {"device": device, "size": size, "budget_s": budget_s, "parts": only},
            "steps": steps + not_run, "peak": {"tflop_per_s": peak, "note": note},
            "speed": speed.rows(records, peak), "decode": decoded}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.gpu_run", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="where the reports and the steps' logs go")
    p.add_argument("--budget-s", type=float, default=540.0, help="seconds for the whole run")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda where torch sees one")
    p.add_argument("--size", choices=("full", "tiny"), default="full", help="the chip's sizes, or a smoke run's")
    p.add_argument("--parts", type=lambda s: s.split(","), default=list(PARTS), help="which parts, comma-separated")
    a = p.parse_args(argv)
    unknown = sorted(set(a.parts) - set(PARTS))
    if unknown:
        p.error(f"unknown part {', '.join(unknown)}; the parts are {', '.join(PARTS)}")
    device = a.device or _default_device()
    result = run(a.out, device, a.size, a.budget_s, [n for n in PARTS if n in a.parts])
    j, m = report.write(result, a.out)
    print(f"gpu_run: wrote {m} and {j}", flush=True)
    return 1 if any(s["status"] == FAILED for s in result["steps"]) else 0


def _default_device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


if __name__ == "__main__":
    sys.exit(main())
