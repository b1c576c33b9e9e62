"""The bench's charts: one PNG per workload (``bench.report`` writes them beside its Markdown)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from bench.targets import frameworks, records  # noqa: E402


def chart(runs: list[dict[str, Any]], workload: str, out: Path) -> Path | None:
    """One PNG: a bar per model and dtype (time, or tokens/s for generation) labelled with its ratio to the
    fastest; for scaling, time against length on log-log axes."""
    if workload == "scaling":
        return _scaling_chart(runs, out)
    recs = records(runs, workload)
    if not recs:
        return None
    per_second = workload in ("greedy", "beam")
    values = [r["metrics"]["tokens_per_s"] if per_second else r["timing"]["median_s"] * 1e3 for r in recs]
    best = max(values) if per_second else min(values)
    labels = [f"{r['subject']}\n{r['dtype']}" for r in recs]
    colours = [f"C{frameworks(runs).index(r['framework'])}" for r in recs]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(recs)), 4.4))
    bars = ax.bar(range(len(recs)), values, color=colours)
    for bar, r, v in zip(bars, recs, values, strict=True):
        bar.set_alpha(1.0 if r["dtype"] == "bfloat16" else 0.55)  # fp32 bars paler
        ratio = best / v if per_second else v / best
        label = "fastest" if ratio == 1.0 else f"{ratio:.2f}× slower"
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(recs)), labels, rotation=45, ha="right", fontsize=8)
    dims = recs[0]["dims"]
    unit = "tokens/s (higher is better)" if per_second else "ms (lower is better)"
    ax.set_ylabel(unit)
    ax.set_title(f"{workload}, {', '.join(f'{k}={v}' for k, v in dims.items())}; paler bars: float32", fontsize=9)
    _footnote(fig, runs)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path = out / f"bench-{workload}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _scaling_chart(runs: list[dict[str, Any]], out: Path) -> Path | None:
    recs = records(runs, "scaling")
    if not recs:
        return None
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    for name in dict.fromkeys(r["subject"] for r in recs):
        mine = sorted((r for r in recs if r["subject"] == name), key=lambda r: r["dims"]["S"])
        fw = frameworks(runs).index(mine[0]["framework"])
        ours = name.startswith("impl_")
        ax.loglog([r["dims"]["S"] for r in mine], [r["timing"]["median_s"] * 1e3 for r in mine], marker="o",
                  color=f"C{fw}", linestyle="-" if ours else "--",
                  label=f"{name} ({'ours' if ours else 'stock peer'}), time ~ L^{mine[0]['metrics']['exponent']:.2f}")
    lengths = sorted({r["dims"]["S"] for r in recs})
    ax.set_xticks(lengths, [str(n) for n in lengths])  # the measured lengths, not powers of ten
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}"))
    ax.set_xlabel("S = T (tokens)")
    ax.set_ylabel("forward ms (log scale)")
    ax.set_title(f"forward time against length, B={recs[0]['dims']['B']}, {recs[0]['dtype']}; "
                 "solid: ours, dashed: stock peers", fontsize=9)
    ax.legend(fontsize=7)
    _footnote(fig, runs)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path = out / "bench-scaling.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _footnote(fig: plt.Figure, runs: list[dict[str, Any]]) -> None:
    """The machine and the date of the run, at the figure's foot."""
    m = runs[0]["environment"]["machine"]
    fig.text(0.01, 0.01, f"{m['cpu']}, {m['cores']} cores, device {runs[0]['environment']['device']}, "
             f"{m.get('date', 'date not recorded')}", fontsize=7, color="0.35")
