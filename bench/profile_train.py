"""Where impl_torch's mixed training step goes beside the stock peer's: tokens/s of both, and our step's operators
by class (``torch.profiler``, self CPU time and calls), at the bench's train shapes.

    taskset -c 1 python -m bench.profile_train --configs tiny,mini,base --batch 8

One intra-op thread (the translation demo's setting). Ours is ``impl_torch.train_step`` on a bf16-compute,
fp32-parameter model (the contract's mixed precision); the peer is ``bench.bench_torch.peer_trainer`` (autocast
bf16, its own Adam). Both on the same batch, their repeats interleaved (``bench.common.measure_together``); the
ratio ours/peer of tokens/s is judged per round against 1 (``bench.verdict``).
"""

from __future__ import annotations

import argparse
import collections

import torch

import impl_torch
import spec
from bench import bench_torch, verdict
from bench.common import bench_params, inputs, measure_together, targets

CLASSES = (  # operator class: aten operator names (without "aten::"), or parts of them if longer than 2 letters
    ("matmul", ("mm", "addmm", "matmul", "linear", "bmm", "dot")),
    ("cast/copy", ("_to_copy", "to", "copy_", "clone", "contiguous")),
    ("softmax", ("softmax",)),
    ("layer norm", ("layer_norm", "mean")),
    ("loss", ("cross_entropy", "nll", "log_softmax")),
    ("adam", ("_fused_adam", "_foreach", "addcmul", "sqrt", "lerp")),
    ("embedding", ("embedding",)),
    ("dropout/random", ("bernoulli", "where", "masked_fill", "dropout")),
    ("view/shape", ("view", "reshape", "transpose", "permute", "expand", "t", "select", "slice", "unsqueeze",
                    "as_strided", "detach", "alias", "flatten", "squeeze", "_unsafe_view", "empty", "zeros")),
    ("elementwise", ("add", "sub", "mul", "div", "relu", "threshold", "sum", "fill", "neg", "max")),
)


def subjects(name: str, B: int, S: int, T: int, peer: bool = True) -> tuple:
    """Our step and the peer's (None without ``peer``) on one batch at preset ``name`` (bf16 compute, fp32
    parameters)."""
    config = spec.preset(name, dtype="bfloat16", param_dtype="float32")
    model = impl_torch.from_params(config, bench_params(config))
    src, tgt_in = inputs(config, B, S, T)
    batch = (src, tgt_in, targets(config, tgt_in))
    run = {"model": model, "state": impl_torch.init_train_state(model)}

    def ours() -> None:
        loss, run["model"], run["state"] = impl_torch.train_step(run["model"], run["state"], *batch)
        float(loss)
    if not peer:
        return ours, None
    trainer = bench_torch.peer_trainer(config, "cpu")
    return ours, lambda: trainer.step(*batch)


def op_class(op: str) -> str:
    """The class of an operator name (``CLASSES``): "autograd engine" for the engine's own nodes, "other" for an
    aten operator of no class."""
    if not op.startswith("aten::"):
        return "autograd engine"
    bare = op.removeprefix("aten::")
    for cls, keys in CLASSES:
        if any(bare == k or (len(k) > 2 and k.strip("_") in bare) for k in keys):
            return cls
    return "other"


def profile_table(fn, tokens: int) -> str:
    """One profiled call of ``fn`` (after a warm-up): self CPU ms and calls per operator class, calls per token."""
    fn()
    with torch.profiler.profile() as prof:
        fn()
    ms, calls = collections.Counter(), collections.Counter()
    for e in prof.key_averages():
        ms[op_class(e.key)] += e.self_cpu_time_total / 1e3
        calls[op_class(e.key)] += e.count
    rows = [f"| {c} | {ms[c]:.1f} | {calls[c]} |" for c, _ in ms.most_common()]
    total = f"| total | {sum(ms.values()):.1f} | {sum(calls.values())} ({sum(calls.values()) / tokens:.1f}" \
            f" per token) |"
    return "\n".join(["| class | self ms | calls |", "|---|---|---|", *rows, total])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", type=lambda s: s.split(","), default=["tiny", "mini", "base"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--src-len", type=int, default=64)
    p.add_argument("--tgt-len", type=int, default=64)
    p.add_argument("--repeats", type=int, default=verdict.MIN_ROUNDS)
    p.add_argument("--profile", action="store_true", help="also the operator-class table of our step")
    p.add_argument("--ours-only", action="store_true",
                   help="time our step alone (one line: median ms, spread): runs of two checkouts alternated")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    B, S, T = args.batch, args.src_len, args.tgt_len
    if args.ours_only:
        for name in args.configs:
            t = measure_together([subjects(name, B, S, T, peer=False)[0]], args.repeats)[0].as_dict()
            print(f"{name} ours {t['median_s'] * 1e3:.1f} ms [{t['min_s'] * 1e3:.1f}, {t['max_s'] * 1e3:.1f}]")
        return
    print("| config | ours ms | peer ms | tokens/s ours | tokens/s peer | ours/peer tokens/s [10%, 90%] |")
    print("|---|---|---|---|---|---|")
    for name in args.configs:
        ours, peer = subjects(name, B, S, T)
        a, b = measure_together([ours, peer], args.repeats, until=verdict.versus(1, [0]))
        v = verdict.judge(verdict.paired(b.times_s, a.times_s), 1.0, at_most=False)  # tokens/s ratio = peer/ours s
        tok = B * (S + T)
        print(f"| {name} | {a.median_s * 1e3:.1f} | {b.median_s * 1e3:.1f} | {tok / a.median_s:,.0f} | "
              f"{tok / b.median_s:,.0f} | {v.cell()} ({v.rounds} rounds) |", flush=True)
        if args.profile:
            print(profile_table(ours, tok), flush=True)


if __name__ == "__main__":
    main()
