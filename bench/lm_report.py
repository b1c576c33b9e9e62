"""The decoder-only workloads' report: targets with verdicts, the figures, one chart; ``bench.report`` appends it to
a full run's report, and this writes it alone for a ``--workloads lm`` run:

    python -m bench.lm_report reports/lm/bench-*.json --out bench/results

Every ratio pairs figures of the same interleaved round of one run (``bench.verdict.paired``); a verdict is
"undecided" where the rounds' spread covers the target.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

from spec.api import BACKENDS

matplotlib.use("Agg")  # files only; no display
import matplotlib.pyplot as plt  # noqa: E402

from bench.verdict import judge, paired  # noqa: E402

WORKLOADS = ("lm_prefill", "lm_decode", "lm_generate")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    runs = sorted((json.loads(f.read_text()) for f in args.files),
                  key=lambda r: BACKENDS.index(r["environment"]["framework"]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lm.json").write_text(json.dumps(runs, indent=1))
    chart = lm_chart(runs, args.out)
    text = "# Speed: the decoder-only model beside each framework's stock GPT-2\n\n" + section(runs)
    text += f"\n![{chart.name}]({chart.name})\n" if chart else ""
    (args.out / "lm.md").write_text(text)
    print(text)


def has_lm(runs: list[dict[str, Any]]) -> bool:
    return any(rec["workload"] in WORKLOADS for r in runs for rec in r["records"])


def _recs(runs: list[dict[str, Any]], workload: str) -> list[dict[str, Any]]:
    return [rec for r in runs for rec in r["records"] if rec["workload"] == workload]


def _find(runs: list[dict[str, Any]], workload: str, fw: str, B: int, dtype: str, ours: bool) -> dict | None:
    return next((r for r in _recs(runs, workload) if r["framework"] == fw and r["dims"]["B"] == B
                 and r["dtype"] == dtype and r["subject"].startswith("impl_") == ours), None)


def section(runs: list[dict[str, Any]]) -> str:
    """Setup, targets, figures."""
    return "\n".join([setup(runs), "", "### Targets", "", targets(runs), "", "### Figures", "", figures(runs), ""])


def setup(runs: list[dict[str, Any]]) -> str:
    env, opt = runs[0]["environment"], runs[0]["options"]
    m = env["machine"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores ({', '.join(m['simd'])}), device `{env['device']}`, "
             f"{m.get('date', '')}. Size `{opt['lm_size']}`, prompt L={opt['lm_prompt']}, B in {opt['lm_batches']}, "
             f"decode steps timed {opt['lm_steps']} at a time at context {opt['lm_short']} and L in one cache of "
             f"capacity L + {opt['lm_steps']}, greedy generation of {opt['lm_new_tokens']} new tokens; medians of "
             f"up to {opt['repeats']} interleaved rounds after an untimed one. Peers: each framework's stock GPT-2 "
             "(its own layers: learned positions, GELU, biases) at the same sizes, random weights, its own cache "
             "and greedy generation."]
    lines += [f"- {r['environment']['framework']}: " + ", ".join(
        f"{k} {v}" for k, v in r["environment"].items() if k not in ("framework", "device", "machine"))
        for r in runs]
    return "\n".join(lines)


def _cell(ratios: list[float] | None, target: float, at_least: bool) -> str:
    return judge(ratios, target, at_most=not at_least).cell() if ratios else "—"


def targets(runs: list[dict[str, Any]]) -> str:
    """Per framework, B and dtype: the decode step's growth from the short context to L (ours), bf16 over fp32
    decode speed (ours), and ours over the peer in tokens/s for each workload (time of the peer / time of ours)."""
    rows = ["| framework | B | dtype | ours: step at L / at short ≤ 1.10 | ours: bf16 / fp32 decode tok/s ≥ 1 | "
            "ours / peer prefill tok/s ≥ 1 | ours / peer decode tok/s ≥ 1 | ours / peer generate tok/s ≥ 1 |",
            "|---|---|---|---|---|---|---|---|"]
    for fw, B, dtype in _keys(runs):
        ours = {w: _find(runs, w, fw, B, dtype, True) for w in WORKLOADS}
        peer = {w: _find(runs, w, fw, B, dtype, False) for w in WORKLOADS}
        d = ours["lm_decode"]
        growth = d and paired(d["times_s"], d["short_step_s"])
        fp32 = _find(runs, "lm_decode", fw, B, "float32", True)
        speed = paired(fp32["times_s"], d["times_s"]) if d and fp32 and dtype == "bfloat16" else None
        vs = [paired(peer[w]["times_s"], ours[w]["times_s"]) if ours[w] and peer[w] else None
              for w in WORKLOADS]
        cells = [_cell(growth, 1.10, False), _cell(speed, 1.0, True), *(_cell(v, 1.0, True) for v in vs)]
        rows.append(f"| {fw} | {B} | {dtype} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + ("\n\nEach cell: the median over rounds of the per-round ratio, the 10-90% interval of "
                              "the rounds, and ✓ or ✗ where the whole interval lies on one side of the target, "
                              "undecided where it covers it (`bench.verdict`).")


def _keys(runs: list[dict[str, Any]]) -> list[tuple[str, int, str]]:
    return list(dict.fromkeys((r["framework"], r["dims"]["B"], r["dtype"]) for r in _recs(runs, "lm_prefill")))


def figures(runs: list[dict[str, Any]]) -> str:
    rows = ["| framework | B | model | dtype | prefill tok/s | prefill GFLOP/s | decode tok/s at L | ms/step at "
            "short → L | generate new tok/s | first call s: prefill, generate |", "|---|---|---|---|---|---|---|---|"
            "---|---|"]
    for p in _recs(runs, "lm_prefill"):
        key = (p["framework"], p["dims"]["B"], p["dtype"], p["subject"].startswith("impl_"))
        d, g = _find(runs, "lm_decode", *key), _find(runs, "lm_generate", *key)
        step = (f"{np.median(d['short_step_s']) * 1e3:.1f} → {d['timing']['median_s'] * 1e3:.1f}" if d else "—")
        cells = [p["framework"], str(p["dims"]["B"]), p["subject"], p["dtype"], f"{p['metrics']['tokens_per_s']:,.0f}",
                 f"{p['metrics']['flop_per_s'] / 1e9:,.0f}",
                 f"{d['metrics']['tokens_per_s']:,.1f}" if d else "—", step,
                 f"{g['metrics']['tokens_per_s']:,.1f}" if g else "—",
                 f"{p['timing']['first_s']:.1f}, " + (f"{g['timing']['first_s']:.1f}" if g else "—")]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def lm_chart(runs: list[dict[str, Any]], out: Path) -> Path | None:
    """One PNG: a panel per workload and B, a bar per framework, model and dtype in tokens/s (log scale); ours
    solid, the peers hatched, fp32 paler."""
    keys = _keys(runs)
    if not keys:
        return None
    batches = sorted({B for _, B, _ in keys})
    fig, axes = plt.subplots(len(batches), 3, figsize=(13, 3.6 * len(batches)), squeeze=False)
    for row, B in enumerate(batches):
        for col, workload in enumerate(WORKLOADS):
            ax, recs = axes[row][col], [r for r in _recs(runs, workload) if r["dims"]["B"] == B]
            values = [r["metrics"]["tokens_per_s"] for r in recs]
            bars = ax.bar(range(len(recs)), values,
                          color=[f"C{BACKENDS.index(r['framework'])}" for r in recs])
            for bar, r in zip(bars, recs, strict=True):
                bar.set_alpha(1.0 if r["dtype"] == "bfloat16" else 0.55)
                bar.set_hatch("" if r["subject"].startswith("impl_") else "//")
            ax.set_xticks(range(len(recs)), [f"{r['subject']}\n{r['dtype']}" for r in recs], rotation=60,
                          ha="right", fontsize=6)
            ax.set_yscale("log")
            ax.set_title(f"{workload[3:]}, B={B} (tokens/s)", fontsize=9)
    m = runs[0]["environment"]["machine"]
    fig.text(0.01, 0.005, f"{m['cpu']}, {m['cores']} cores, size {runs[0]['options']['lm_size']}, "
             f"{m.get('date', '')}; hatched: stock peers, paler: float32", fontsize=7, color="0.35")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    path = out / "bench-lm.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


if __name__ == "__main__":
    main()
