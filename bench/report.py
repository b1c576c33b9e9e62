"""Merge the frameworks' bench files into one JSON, a Markdown report, one PNG chart per workload, and (after a
full run) the speed section of docs/speed.md.

    python -m bench.report reports/.../bench-*.json --out reports/.../ [--doc docs/speed.md]

Every ratio compares figures of the same run on the same machine. Utilisation is a forward's FLOP rate
(``spec.flops``) over the same framework's own matrix-product rate in the same run (the ``matmul`` workload),
and on a known GPU over its datasheet dense bf16 peak.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from bench import lm_report, targets, translate_report  # noqa: E402
from bench.targets import frameworks, one, records  # noqa: E402

FRAMEWORKS = ("torch", "jax", "tf")
WORKLOADS = ("matmul", "forward", "greedy", "beam", "train", "scaling", "lm")
# Datasheet dense bf16 peak (no sparsity), FLOP/s: H100 SXM and H200 share the same tensor cores.
GPU_PEAK_BF16 = {"H100": 989e12, "H200": 989e12}
RESULTS = Path(__file__).resolve().parent / "results"  # the committed copy docs/speed.md shows
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--doc", type=Path, help="rewrite this Markdown file's speed section (full runs only)")
    args = p.parse_args(argv)
    runs = [json.loads(f.read_text()) for f in args.files]
    runs.sort(key=lambda r: FRAMEWORKS.index(r["environment"]["framework"]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(runs, indent=1))
    charts = [chart(runs, w, args.out) for w in ("forward", "greedy", "beam", "train", "scaling")]
    charts.append(lm_report.lm_chart(runs, args.out))
    markdown = report(runs, [c.name for c in charts if c])
    (args.out / "bench.md").write_text(markdown)
    print(markdown)
    if args.doc:
        if _full(runs):
            update_doc(args.doc, runs, args.out)
        else:
            print(f"{args.doc} left as it is: only a full run (every framework and workload) rewrites it")


def _full(runs: list[dict[str, Any]]) -> bool:
    return ({r["environment"]["framework"] for r in runs} == set(FRAMEWORKS)
            and all(set(r["options"]["workloads"]) >= set(WORKLOADS) for r in runs))


def _ms(rec: dict[str, Any] | None) -> str:
    return f"{rec['timing']['median_s'] * 1e3:,.0f}" if rec else "—"


# ----------------------------------------------------------------- Markdown

def report(runs: list[dict[str, Any]], charts: list[str]) -> str:
    """The whole report: machine and versions, then one table per workload, then the targets."""
    parts = ["# Speed: every backend beside its framework's stock Transformer", "", environment(runs), "",
             "## Targets", "", targets.table(runs), "",
             "## Teacher-forced forward", "", timed_table(runs, "forward"), "",
             "## Generation", "", generation_table(runs), "",
             "## How forward time grows with length (S = T)", "", scaling_table(runs), "",
             "## Matrix-product rates (the denominators of utilisation)", "", matmul_table(runs), ""]
    parts += ["## Training step (forward, backward, Adam; fp32 master weights)", "", timed_table(runs, "train"), "",
              "Ours is the library's `train_step`; each stock peer's is its framework's own idiom (torch autocast "
              "and `torch.optim.Adam`, Flax `dtype=bfloat16` modules and optax under `jax.jit`, Keras "
              "`mixed_bfloat16` layers and `GradientTape` under XLA) with the same dropout rate, label smoothing "
              "and Adam betas and eps, at a constant learning rate (equation 3's peak), on the same batch, timed "
              "together. FLOPs are 3x the forward's (`spec.flops.train_step_flops`).", ""]
    if targets.records(runs, "memory"):
        parts += ["## Peak memory (each subject in its own process)", "", targets.memory_table(runs), ""]
    if lm_report.has_lm(runs):
        parts += ["## The decoder-only model beside each framework's stock GPT-2", "", lm_report.section(runs)]
    if translate_report.has_translate(runs):
        parts += ["## Translation beside Hugging Face's Marian and CTranslate2", "", translate_report.section(runs)]
    parts += [f"![{c}]({c})" for c in charts]
    return "\n".join(parts) + "\n"


def environment(runs: list[dict[str, Any]]) -> str:
    env, opt = runs[0]["environment"], runs[0]["options"]
    m = env["machine"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores ({', '.join(m['simd'])}), device `{env['device']}`, "
             f"Python {m['python']}.",
             f"Config `{opt['config']}`, B={opt['batch']}, S={opt['src_len']}, T={opt['tgt_len']}, "
             f"new tokens {opt['new_tokens']}, medians of up to {opt['repeats']} repeats after a first call "
             f"(compilation) timed apart."]
    for r in runs:
        e = r["environment"]
        lines.append(f"- {e['framework']}: " + ", ".join(f"{k} {v}" for k, v in e.items()
                                                          if k not in ("framework", "device", "machine")))
    return "\n".join(lines)


def _num(x: float | None, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def _best_matmul(runs: list[dict[str, Any]], fw: str) -> dict[str, dict[str, Any]]:
    """dtype -> the faster of the run's product-rate records (``run.py`` measures it at the start and the end)."""
    best: dict[str, dict[str, Any]] = {}
    for r in records(runs, "matmul", framework=fw):
        if r["dtype"] not in best or r["metrics"]["flop_per_s"] > best[r["dtype"]]["metrics"]["flop_per_s"]:
            best[r["dtype"]] = r
    return best


def _rates(runs: list[dict[str, Any]], fw: str) -> dict[str, float]:
    return {dtype: r["metrics"]["flop_per_s"] for dtype, r in _best_matmul(runs, fw).items()}


def _peak(runs: list[dict[str, Any]], fw: str) -> float | None:
    name = next(r["environment"].get("device_name", "") for r in runs if r["environment"]["framework"] == fw)
    return next((p for gpu, p in GPU_PEAK_BF16.items() if gpu in name), None)


def timed_table(runs: list[dict[str, Any]], workload: str) -> str:
    """The forward or training-step records: time, spread, rate and utilisation of each model and dtype."""
    rows = ["| model | dtype | ms | min–max ms | GFLOP/s | % of own fp32 GEMM | % of own bf16 GEMM "
            "| % of GPU bf16 peak | × fastest | first call s |", "|---|---|---|---|---|---|---|---|---|---|"]
    recs = records(runs, workload)
    fastest = min((r["timing"]["median_s"] for r in recs), default=None)
    for r in recs:
        rate, rates, peak = r["metrics"]["flop_per_s"], _rates(runs, r["framework"]), _peak(runs, r["framework"])
        pct = [f"{100 * rate / rates[d]:.0f}%" if d in rates else "—" for d in ("float32", "bfloat16")]
        spread = f"{r['timing']['min_s'] * 1e3:,.0f}–{r['timing']['max_s'] * 1e3:,.0f}"  # ratios inside it are noise
        rows.append(f"| {r['subject']} | {r['dtype']} | {_ms(r)} | {spread} | {rate / 1e9:,.0f} | {pct[0]} | "
                    f"{pct[1]} | "
                    f"{f'{100 * rate / peak:.1f}%' if peak else '—'} | "
                    f"{r['timing']['median_s'] / fastest:.2f} | {r['timing']['first_s']:.1f} |")
    return "\n".join(rows)


def generation_table(runs: list[dict[str, Any]]) -> str:
    rows = ["| model | dtype | greedy tok/s | cached decode tok/s | ms/step at token 32 → 128 | cached × faster "
            "than recomputed (first 32) | beam 4 tok/s | beam / greedy time | first call s: greedy, beam |",
            "|---|---|---|---|---|---|---|---|---|"]
    for g in records(runs, "greedy"):
        fw, dt = g["framework"], g["dtype"]
        m = (one(runs, "greedy_steps", framework=fw, dtype=dt) or {}).get("metrics", {})
        b = one(runs, "beam", framework=fw, dtype=dt)
        at = [v for k, v in m.items() if k.startswith("ms_per_step_at_")]
        cells = [g["subject"], dt, f"{g['metrics']['tokens_per_s']:,.0f}", _num(m.get("tokens_per_s"), ",.0f"),
                 " → ".join(f"{v:.1f}" for v in at) or "—", _num(m.get("cache_speedup"), ".1f"),
                 _num(b and b["metrics"]["tokens_per_s"], ",.0f"), _num(b and b["metrics"].get("vs_greedy"), ".2f"),
                 f"{g['timing']['first_s']:.1f}, " + _num(b and b["timing"]["first_s"], ".1f")]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def scaling_table(runs: list[dict[str, Any]]) -> str:
    recs = records(runs, "scaling")
    lengths = sorted({r["dims"]["S"] for r in recs})
    rows = ["| model | dtype | " + " | ".join(f"L={L} ms" for L in lengths) + " | time ∝ L^k, k |",
            "|---|---|" + "---|" * (len(lengths) + 1)]
    for name in dict.fromkeys(r["subject"] for r in recs):
        mine = {r["dims"]["S"]: r for r in recs if r["subject"] == name}
        first = next(iter(mine.values()))
        rows.append(f"| {name} | {first['dtype']} | " + " | ".join(_ms(mine.get(L)) for L in lengths)
                    + f" | {first['metrics']['exponent']:.2f} |")
    return "\n".join(rows)


def matmul_table(runs: list[dict[str, Any]]) -> str:
    rows = ["| framework | (M, K, N) | fp32 GFLOP/s | bf16 GFLOP/s |", "|---|---|---|---|"]
    for fw in frameworks(runs):
        recs = _best_matmul(runs, fw)
        if recs:
            d = next(iter(recs.values()))["dims"]
            rate = [f"{recs[t]['metrics']['flop_per_s'] / 1e9:,.0f}" if t in recs else "—"
                    for t in ("float32", "bfloat16")]
            rows.append(f"| {fw} | ({d['M']}, {d['K']}, {d['N']}) | {rate[0]} | {rate[1]} |")
    return "\n".join(rows)


# ----------------------------------------------------------------- charts

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


# ----------------------------------------------------------------- docs/speed.md

def update_doc(doc: Path, runs: list[dict[str, Any]], out: Path) -> None:
    """Copy this run's report and charts to ``results/`` and put its targets and forward tables between the
    bench markers of ``doc``."""
    RESULTS.mkdir(exist_ok=True)
    for f in [*out.glob("bench-*.png"), out / "bench.md", out / "bench.json"]:
        shutil.copy(f, RESULTS / f.name)
    rel = Path(os.path.relpath(RESULTS, doc.resolve().parent)).as_posix()
    memory = ["Peak memory, each subject in its own process:", "", targets.memory_table(runs), ""] \
        if targets.records(runs, "memory") else []
    section = "\n".join([BEGIN, "", environment(runs), "", targets.table(runs), "", *memory,
                         timed_table(runs, "forward"), "",
                         generation_table(runs), "",
                         "Training step (forward, backward, Adam; fp32 master weights), ours and each peer's own:", "",
                         timed_table(runs, "train"), "", f"![forward]({rel}/bench-forward.png)",
                         f"![greedy]({rel}/bench-greedy.png)", "",
                         f"Full report: [{rel}/bench.md]({rel}/bench.md); regenerate with `nox -s bench`.", "", END])
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{doc} has no {BEGIN} ... {END} section to rewrite")
    doc.write_text(re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: section, text, flags=re.S))
    print(f"rewrote the speed section of {doc} and {RESULTS}")


if __name__ == "__main__":
    main()
