"""Peak memory per workload (``bench.run --workloads memory``): each subject runs one workload alone in a process
of its own, so that the process's peak resident memory is the subject's; ``run_memory`` starts those processes,
``--memory-runs`` per subject in rounds that take each subject in turn (a verdict needs ``bench.verdict.MIN_RUNS``),
and records every process's peak:

    python -m bench.memory --framework jax --workload train --subject peer --dtype bfloat16 --config base

Workloads as ``bench.run``'s, at its shapes: ``forward`` (ours or the stock peer), ``greedy`` and ``beam`` (ours:
the peers that decode are the translation workload's, measured there), ``train`` (our ``train_step`` or the
peer's own step; ``bfloat16`` is mixed precision, fp32 master weights). The workload runs twice (the first call
compiles), then the process prints one JSON object: the subject, its peak resident memory, the resident memory
before the subject was built (the framework's own) and each run's seconds (``--runs``, at least 2: the first
compiles; ``bench.paper_batch`` times the paper's batch this way). Torch's threads: ``--threads``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import spec
from bench.common import bench_params, inputs, rss_mb, targets
from spec.api import BACKENDS

WORKLOADS = ("forward", "greedy", "beam", "train")
OOM_SCORE_ADJ = "/proc/self/oom_score_adj"


def run_memory(runner: Any) -> None:
    """Every (workload, dtype, subject) in ``--memory-runs`` processes of its own; one ``memory`` record each, with
    every process's peak (``peak_rss_runs_mb``) and the medians."""
    a = runner.args
    subjects = [(workload, dtype, who) for workload in WORKLOADS for dtype in a.dtypes
                for who in (("ours", "peer") if workload in ("forward", "train") else ("ours",))]
    rounds = [[_alone_or_raise(a, workload, who, dtype) for workload, dtype, who in subjects]
              for _ in range(a.memory_runs)]
    for i, (workload, dtype, _) in enumerate(subjects):
        outs = [r[i] for r in rounds]
        peaks = [out["peak_rss_mb"] for out in outs]
        runner.record("memory", outs[0]["subject"], dtype, {"B": a.batch, "S": a.src_len, "T": a.tgt_len},
                      of=workload, peak_rss_runs_mb=peaks,
                      metrics={"peak_rss_mb": float(np.median(peaks)),
                               "framework_rss_mb": float(np.median([out["framework_rss_mb"] for out in outs]))})


def _alone_or_raise(a: argparse.Namespace, workload: str, who: str, dtype: str) -> dict[str, Any]:
    out = alone(a, workload, who, dtype, a.batch)
    if "error" in out:
        raise RuntimeError(out["error"])
    return out


def alone(a: argparse.Namespace, workload: str, who: str, dtype: str, batch: int, runs: int = 2) -> dict[str, Any]:
    """One subject's workload in a process of its own, at ``bench.run``'s options ``a`` and batch ``batch``: what
    the process prints (``main``), or ``{"error": ...}`` naming the command and its exit status when it fails
    (a process the kernel ends for want of memory exits with -9)."""
    cmd = [sys.executable, "-m", "bench.memory", "--framework", a.framework, "--workload", workload,
           "--subject", who, "--dtype", dtype, "--config", a.config, "--batch", str(batch),
           "--src-len", str(a.src_len), "--tgt-len", str(a.tgt_len), "--new-tokens", str(a.new_tokens[0]),
           "--runs", str(runs), "--threads", str(a.threads)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    if done.returncode:
        return {"error": f"{' '.join(cmd[1:])} exited with {done.returncode}:\n{done.stderr[-3000:]}",
                "returncode": done.returncode}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _first_to_go() -> str | None:
    """The kernel, short of memory, ends this subject's process rather than the run that started it (Linux's
    ``oom_score_adj`` at its maximum; raising one's own needs no privilege): the value it now holds, or None
    where there is no such file."""
    if not os.path.exists(OOM_SCORE_ADJ):
        return None
    with open(OOM_SCORE_ADJ, "w") as f:
        f.write("1000")
    with open(OOM_SCORE_ADJ) as f:
        return f.read().strip()


def subject(args: argparse.Namespace, fw) -> tuple[str, Callable[[], object]]:
    """(name, one run of the workload) of the subject asked for."""
    B, S, T, n = args.batch, args.src_len, args.tgt_len, args.new_tokens
    param_dtype = "float32" if args.workload == "train" else args.dtype
    config = spec.preset(args.config, dtype=args.dtype, param_dtype=param_dtype)
    src, tgt_in = inputs(config, B, S, T)
    if args.workload == "train":
        tgt_out = targets(config, tgt_in)  # (B, T)
        if args.subject == "peer":
            peer = fw.peer_trainer(config, "cpu")
            return peer.name, lambda: peer.step(src, tgt_in, tgt_out)
        impl = importlib.import_module(f"impl_{args.framework}")
        run = {"model": fw.ours(config, bench_params(config), "cpu").model}
        run["state"] = impl.init_train_state(run["model"])

        def step() -> None:
            loss, run["model"], run["state"] = impl.train_step(run["model"], run["state"], src, tgt_in, tgt_out)
            float(loss)
        return f"impl_{args.framework}", step
    model = fw.peer(config, "cpu") if args.subject == "peer" else fw.ours(config, bench_params(config), "cpu")
    if args.workload == "forward":
        return model.name, lambda: model.forward(src, tgt_in)
    return model.name, (lambda: model.greedy(src, n)) if args.workload == "greedy" else lambda: model.beam(src, n, 4)


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    oom = _first_to_go()
    if args.runs < 2:
        raise SystemExit(f"error: --runs must be at least 2 (the first compiles), got {args.runs}")
    if args.subject == "peer" and args.workload in ("greedy", "beam"):
        raise SystemExit(f"error: no stock peer decodes here ({args.workload}): see the translate workload")
    fw = importlib.import_module(f"bench.bench_{args.framework}")
    fw.setup("cpu")
    if args.framework == "torch":
        import torch
        torch.set_num_threads(args.threads)
    before = rss_mb()
    name, run = subject(args, fw)
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    print(json.dumps({"subject": name, "peak_rss_mb": rss_mb(), "framework_rss_mb": before, "times_s": times,
                      "oom_score_adj": oom}))


def subject_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options naming one subject's workload (``subject``'s ``args``), added to ``p``; ``bench.profile``
    shares them."""
    p.add_argument("--framework", required=True, choices=BACKENDS)
    p.add_argument("--workload", required=True, choices=WORKLOADS)
    p.add_argument("--subject", default="ours", choices=("ours", "peer"))
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--config", default="base")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--src-len", type=int, default=64)
    p.add_argument("--tgt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2, help="torch's intra-op threads")
    return p


def _parser() -> argparse.ArgumentParser:
    p = subject_arguments(argparse.ArgumentParser(description=__doc__,
                                                  formatter_class=argparse.RawDescriptionHelpFormatter))
    p.add_argument("--runs", type=int, default=2, help="runs of the workload, the first compiling (at least 2)")
    return p


if __name__ == "__main__":
    main()
