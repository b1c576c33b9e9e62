"""Merge the frameworks' bench files into one JSON, a Markdown report, one PNG chart per workload, and (after a
full run) the speed section of docs/speed.md.

    python -m bench.report reports/.../bench-*.json --out reports/.../ \
        [--doc docs/speed.md --readme README.md --results bench/results]

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

from bench import lm_report, paper_batch, targets, translate_report
from bench.charts import chart
from bench.targets import frameworks, one, records
from spec.api import BACKENDS

WORKLOADS = ("matmul", "forward", "greedy", "beam", "train", "scaling", "lm", "translate", "paper_batch",
             "memory")
# Datasheet dense bf16 peak (no sparsity), FLOP/s, by a name the device reports: the first key the device's name
# contains is taken ("H100 PCIe" before "H100", which is the SXM part). H100 SXM and H200 share the same tensor cores.
GPU_PEAK_BF16 = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "A100": 312e12}
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--doc", type=Path, help="rewrite this Markdown file's speed section (full runs only)")
    p.add_argument("--readme", type=Path, help="with --doc: rewrite this file's speed section with the targets")
    p.add_argument("--results", type=Path, help="with --doc: copy the report and charts here (bench/results)")
    args = p.parse_args(argv)
    runs = [json.loads(f.read_text()) for f in args.files]
    runs.sort(key=lambda r: BACKENDS.index(r["environment"]["framework"]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(runs, indent=1))
    charts = [chart(runs, w, args.out) for w in ("forward", "greedy", "beam", "train", "scaling")]
    charts.append(lm_report.lm_chart(runs, args.out))
    markdown = report(runs, [c.name for c in charts if c])
    (args.out / "bench.md").write_text(markdown)
    print(markdown)
    if args.doc:
        if not (args.readme and args.results):
            p.error("--doc needs --readme and --results: an installed bench knows no repository")
        if _full(runs):
            update_doc(args.doc, args.readme, args.results, runs, args.out)
        else:
            print(f"{args.doc} left as it is: only a full run (every framework and workload) rewrites it")


def _full(runs: list[dict[str, Any]]) -> bool:
    return ({r["environment"]["framework"] for r in runs} == set(BACKENDS)
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
    if targets.records(runs, "paper_batch"):
        parts += ["## From the bench's batch to the paper's (about 25,000 + 25,000 tokens)", "",
                  _paper_batch(runs), ""]
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


def matmul_rates(runs: list[dict[str, Any]], fw: str) -> dict[str, float]:
    """{dtype: the framework's best matrix-product rate, FLOP/s}: the denominators of utilisation."""
    return {dtype: r["metrics"]["flop_per_s"] for dtype, r in _best_matmul(runs, fw).items()}


def _paper_batch(runs: list[dict[str, Any]]) -> str:
    return paper_batch.table(runs, {fw: matmul_rates(runs, fw).get("bfloat16") for fw in frameworks(runs)})


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
        rate, rates, peak = r["metrics"]["flop_per_s"], matmul_rates(runs, r["framework"]), _peak(runs, r["framework"])
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


# ----------------------------------------------------------------- docs/speed.md

def update_doc(doc: Path, readme: Path, results: Path, runs: list[dict[str, Any]], out: Path) -> None:
    """Copy this run's report and charts to ``results``, put its tables between the bench markers of ``doc``
    and its targets between those of ``readme``."""
    results.mkdir(exist_ok=True)
    for f in [*out.glob("bench-*.png"), out / "bench.md", out / "bench.json"]:
        shutil.copy(f, results / f.name)
    rel = Path(os.path.relpath(results.resolve(), doc.resolve().parent)).as_posix()
    memory = ["Peak memory, each subject in its own process:", "", targets.memory_table(runs), ""] \
        if targets.records(runs, "memory") else []
    batch = ["From the bench's batch to the paper's, ours in bf16 (mixed-precision training), each in its own "
             "process:", "", _paper_batch(runs), ""] if targets.records(runs, "paper_batch") else []
    translate = ["Translation beside Hugging Face's Marian and CTranslate2:", "", translate_report.section(runs)] \
        if translate_report.has_translate(runs) else []
    _rewrite(doc, [environment(runs), "", targets.table(runs), "", *memory, *batch, *translate,
                   timed_table(runs, "forward"), "", generation_table(runs), "",
                   "Training step (forward, backward, Adam; fp32 master weights), ours and each peer's own:", "",
                   timed_table(runs, "train"), "", f"![forward]({rel}/bench-forward.png)",
                   f"![greedy]({rel}/bench-greedy.png)", "",
                   f"Full report: [{rel}/bench.md]({rel}/bench.md); regenerate with `nox -s bench`."])
    _rewrite(readme, readme_lines(runs, Path(os.path.relpath(doc.resolve(), readme.resolve().parent)).as_posix()))
    print(f"rewrote the speed sections of {doc} and {readme}, and {results}")


def readme_lines(runs: list[dict[str, Any]], doc: str) -> list[str]:
    """The README's speed section: where it was measured, the targets, translation beside Marian in one table;
    every interval and verdict is in ``doc``."""
    m = runs[0]["environment"]["machine"]
    lines = [f"From the last full `nox -s bench` ({m['cpu']}, {m['cores']} cores, {m.get('date')}); every "
             f"interval and verdict, peak memory, generation and the paper's batch: [{doc}]({doc}).", "",
             targets.table(runs)]
    if translate_report.has_translate(runs):
        lines += ["", *translate_report.summary(translate_report.records_of(runs))]
    return lines


def _rewrite(doc: Path, lines: list[str]) -> None:
    """Replace what lies between ``BEGIN`` and ``END`` in ``doc`` with ``lines``."""
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{doc} has no {BEGIN} ... {END} section to rewrite")
    section = "\n".join([BEGIN, "", *lines, "", END])
    doc.write_text(re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: section, text, flags=re.S))


if __name__ == "__main__":
    main()
