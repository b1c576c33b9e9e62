"""The first training step of a new shape bucket, per backend: what a user pays before the first update of each
new batch shape (jax and tf compile one program per shape; torch runs eagerly).

    python -m tools.first_step                                    # mini, bf16, B=8, three lengths, every backend
    python -m tools.first_step --backends jax --preset tiny --lengths 16 --out reports/first-step

Each backend runs in a fresh process (no program compiled by another backend's run or an earlier one), pinned to one
core with one intra-op thread (``text.cli.load_backend``), with glibc's malloc keeping freed memory (``--malloc
retain``, as ``python -m text train`` runs by default: ``text.malloc``) or at its defaults. Per length L, the model
takes ``train_step`` on a new (B, L) batch four times: the first call's seconds, the median of the next three (the
warm step), and their difference, the cost of the new bucket. jax also reports how that cost splits into tracing
(jaxpr), lowering and XLA compilation (``jax.monitoring``'s compile events); tf and torch report the difference
only. Writes ``first-step.json`` and ``first-step.md`` under ``--out`` with the CPU and versions.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import machine
from spec.api import BACKENDS

WARM = 3  # warm calls after the first; their median is the warm step
# jax's compile events (jax._src.dispatch), seconds each; summed per call.
JAX_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace_s",
              "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
              "/jax/core/compile/backend_compile_duration": "compile_s"}


def measure(backend: str, preset: str, dtype: str, batch: int, lengths: list[int], core: int, how: str
            ) -> dict[str, Any]:
    """In this process: ``backend``'s first and warm ``train_step`` per length (seconds) and, for jax, the split;
    ``how``: "retain" (``text.malloc``) or "default", glibc malloc's settings."""
    from spec.config import preset as make_config
    from text import cli, malloc

    kept = malloc.retain_freed_memory() if how == "retain" else {}  # before the framework's threads start
    impl = cli.load_backend(backend, threads=1, cores=[core])
    events = _listen_jax() if backend == "jax" else None
    config = make_config(preset, dtype=dtype)
    model = impl.Transformer(config, 0)
    state = impl.init_train_state(model)
    rng, rows = np.random.default_rng(0), []
    for n in lengths:
        src, tgt_in, tgt_out = (rng.integers(4, config.vocab_size, (batch, n)).astype(np.int32) for _ in range(3))
        (first, split), *warm = (_timed(impl, model, state, (src, tgt_in, tgt_out), events) for _ in range(1 + WARM))
        warm = float(np.median([seconds for seconds, _ in warm]))
        rows.append({"length": n, "first_s": first, "warm_s": warm, "new_bucket_s": first - warm, **split})
    framework = sys.modules[{"torch": "torch", "jax": "jax", "tf": "tensorflow"}.get(backend, backend)]
    return {"backend": backend, "version": getattr(framework, "__version__", "?"), "malloc": kept, "rows": rows}


def _timed(impl: Any, model: Any, state: Any, batch: tuple, events: dict | None) -> tuple[float, dict]:
    """One ``train_step`` on ``batch``: its seconds (to the loss on the host) and the jax compile events it fired."""
    if events is not None:
        events.clear()
    start = time.perf_counter()
    loss, _, _ = impl.train_step(model, state, *batch)
    float(np.asarray(loss))                                       # synchronised: the loss is on the host
    return time.perf_counter() - start, dict(events or {})


def _listen_jax() -> dict[str, float]:
    """A dict that jax's compile events add their seconds to, by ``JAX_EVENTS`` key."""
    import jax

    seen: dict[str, float] = {}

    def listener(event: str, seconds: float, **_: Any) -> None:
        if event in JAX_EVENTS:
            seen[JAX_EVENTS[event]] = seen.get(JAX_EVENTS[event], 0.0) + seconds

    jax.monitoring.register_event_duration_secs_listener(listener)
    return seen


def report(runs: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """The markdown table of ``runs``: a row per backend and length."""
    kept = "keeping freed memory (text.malloc)" if args.malloc == "retain" else "at its defaults"
    head = (f"# The first training step of a new shape bucket\n\n`python -m tools.first_step --preset {args.preset} "
            f"--dtype {args.dtype} --batch {args.batch} --lengths {' '.join(map(str, args.lengths))} --malloc "
            f"{args.malloc}`: each backend in a fresh process, one core, one intra-op thread, glibc's malloc {kept}; "
            f"seconds of `train_step` on a new (B, L) batch, its "
            f"first call and the median of the next {WARM} (warm). jax's split: jaxpr tracing, lowering to StableHLO, "
            "XLA compile.\n\n"
            "| backend | version | L | first (s) | warm (s) | new bucket (s) | trace (s) | lower (s) | compile (s) |\n"
            "|---|---|---|---|---|---|---|---|---|\n")
    cell = lambda row, key: f"{row[key]:.2f}" if key in row else ""  # noqa: E731
    lines = [f"| {run['backend']} | {run['version']} | {r['length']} | {cell(r, 'first_s')} | {cell(r, 'warm_s')} | "
             f"{cell(r, 'new_bucket_s')} | {cell(r, 'trace_s')} | {cell(r, 'lower_s')} | {cell(r, 'compile_s')} |"
             for run in runs for r in run["rows"]]
    m = machine()
    foot = f"\n\nMachine: {m['cpu']} ({m['cores']} cores, {', '.join(m['simd'])}), Python {m['python']}, {m['date']}.\n"
    return head + "\n".join(lines) + foot


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", nargs="+", default=list(BACKENDS))
    p.add_argument("--preset", default="mini")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64])
    p.add_argument("--core", type=int, default=0, help="the CPU core every backend's process is pinned to")
    p.add_argument("--malloc", default="retain", choices=("retain", "default"),
                   help="glibc's malloc keeps freed memory (text.malloc), or its defaults")
    p.add_argument("--out", type=Path, default=Path("docs"))
    p.add_argument("--worker", help=argparse.SUPPRESS)  # one backend, in this process: its JSON on stdout
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(args.worker, args.preset, args.dtype, args.batch, args.lengths, args.core,
                                 args.malloc)))
        return
    runs = [_run_worker(b, args) for b in args.backends]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "first-step.json").write_text(json.dumps({"machine": machine(), "runs": runs}, indent=1) + "\n")
    (args.out / "first-step.md").write_text(report(runs, args))
    print(report(runs, args))


def _run_worker(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    """``measure`` for ``backend`` in a fresh Python process."""
    cmd = [sys.executable, "-m", "tools.first_step", "--worker", backend, "--preset", args.preset, "--dtype",
           args.dtype, "--batch", str(args.batch), "--core", str(args.core), "--malloc", args.malloc, "--lengths",
           *map(str, args.lengths)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"tools.first_step: {backend} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
