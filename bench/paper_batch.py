"""The forward and the mixed-precision training step from the bench's B to the paper's batch (``bench.run
--workloads paper_batch``).

The paper trains on batches of about 25,000 source and 25,000 target tokens (section 5.1): B = 390 sentences of
S = T = 64. Each (step, B) runs alone in a process of its own (``bench.memory.alone``), three times (the first
compiles; the figure is the median of the other two), bf16 compute on bf16 weights for the forward and fp32 master
weights for the training step; its peak resident memory comes with it. A process the machine cannot hold
(the kernel ends it for want of memory) is recorded as such, with the memory the measured batches predict.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import spec
from bench.memory import alone
from bench.targets import frameworks, records
from spec.flops import forward_flops, train_step_flops

PAPER_TOKENS = 25_000   # source tokens per batch, and as many target tokens (section 5.1): B = 390 at S = 64
RUNS = 3


def run_paper_batch(runner: Any) -> None:
    """One ``paper_batch`` record per (step, B): ``--paper-forward-batches`` and ``--paper-train-batches``."""
    a = runner.args
    dims, config = {"S": a.src_len, "T": a.tgt_len}, spec.preset(a.config, dtype="bfloat16")
    for step, batches in (("forward", a.paper_forward_batches), ("train", a.paper_train_batches)):
        for B in batches:
            out = alone(a, step, "ours", "bfloat16", B, RUNS)
            flops = (train_step_flops if step == "train" else forward_flops)(config, B, a.src_len, a.tgt_len)
            if "error" in out:
                runner.record("paper_batch", f"impl_{a.framework}", "bfloat16", {"B": B, **dims}, of=step,
                              flops=flops, error=out["error"][-600:], returncode=out["returncode"])
                continue
            median = float(np.median(out["times_s"][1:]))
            timing = {"first_s": out["times_s"][0], "median_s": median, "times_s": out["times_s"][1:]}
            runner.record("paper_batch", out["subject"], "bfloat16", {"B": B, **dims}, of=step, flops=flops,
                          timing=timing, metrics={"tokens_per_s": B * (a.src_len + a.tgt_len) / median,
                                                  "flop_per_s": flops / median, "peak_rss_mb": out["peak_rss_mb"]})


def table(runs: list[dict[str, Any]], bf16_rates: dict[str, float]) -> str:
    """Time, tokens/s, the share of the framework's own bf16 GEMM rate (``bf16_rates``, framework -> FLOP/s),
    peak memory and the cost per token against the smallest B, per framework and step; then what the training
    step's peak memory predicts at the paper's batch."""
    rows = ["| framework | step | B | tokens (src + tgt) | s | tokens/s | % of own bf16 GEMM | peak MiB "
            "| s per token / smallest B's |", "|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for fw in frameworks(runs):
        for step in ("forward", "train"):
            mine = sorted(records(runs, "paper_batch", framework=fw, of=step), key=lambda r: r["dims"]["B"])
            base = next((r for r in mine if "timing" in r), None)
            for r in mine:
                B, tokens = r["dims"]["B"], r["dims"]["B"] * (r["dims"]["S"] + r["dims"]["T"])
                if "timing" not in r:
                    rows.append(f"| {fw} | {step} | {B} | {tokens:,} | exited with {r['returncode']} "
                                f"| — | — | — | — |")
                    continue
                m, s = r["metrics"], r["timing"]["median_s"]
                rate = bf16_rates.get(fw)
                share = f"{100 * m['flop_per_s'] / rate:.0f}%" if rate else "—"
                growth = base["metrics"]["tokens_per_s"] / m["tokens_per_s"]   # s per token / the smallest B's
                rows.append(f"| {fw} | {step} | {B} | {tokens:,} | {s:.2f} | {m['tokens_per_s']:,.0f} | {share} "
                            f"| {m['peak_rss_mb']:,.0f} | {growth:.2f} |")
            notes += _memory_note(fw, step, mine, runs)
    return "\n".join(rows + [""] + notes)


def _memory_note(fw: str, step: str, mine: list[dict[str, Any]], runs: list[dict[str, Any]]) -> list[str]:
    """The least-squares line of peak memory over B, and where it puts the paper's batch."""
    done = [r for r in mine if "timing" in r]
    if step != "train" or len(done) < 2:
        return []
    per_seq, fixed = np.polyfit([r["dims"]["B"] for r in done], [r["metrics"]["peak_rss_mb"] for r in done], 1)
    B = PAPER_TOKENS // done[0]["dims"]["S"]
    have = next(r["environment"]["machine"].get("memory_gib") for r in runs
                if r["environment"]["framework"] == fw)
    return [f"- {fw}, training step: peak memory ≈ {fixed:,.0f} MiB + {per_seq:,.1f} MiB per sequence of "
            f"S = T = {done[0]['dims']['S']}; at the paper's batch (B = {B}) ≈ {(fixed + per_seq * B) / 1024:,.1f} "
            f"GiB, on a machine of {have if have is not None else '?'} GiB."]
