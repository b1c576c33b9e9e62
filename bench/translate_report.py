"""The translation workload's report: per decoding mode and batch, every system's tokens/s and peak memory, and
the targets with verdicts; ``bench.report`` appends it to a full run's report, and this writes it alone for a
``--workloads translate`` run:

    python -m bench.translate_report reports/bench/bench-*.json --out bench/results

Targets: ours at least as fast as Hugging Face's Marian in the same dtype, in every backend; ours in the fastest
backend at least half as fast as CTranslate2 at its fastest compute type; ours at most the peer's peak memory.
Speed ratios pair the figures of one round (``bench.verdict.paired``); the peers run in torch's environment, so
a jax or tf ratio pairs rounds of two runs. A verdict is "undecided" where the rounds' spread covers the target.
Peak memory is judged on every round's process (``bench.verdict.judge_peaks``: ✓ only where ours' highest peak is
at or below Marian's lowest); the table shows each system's median peak.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from bench.verdict import judge, judge_peaks, paired, peaks

MODES = ("translate_greedy", "translate_beam")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    runs = [json.loads(f.read_text()) for f in args.files]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "translate.json").write_text(json.dumps(runs, indent=1))
    text = "# Speed: translation beside Hugging Face's Marian and CTranslate2\n\n" + section(runs)
    (args.out / "translate.md").write_text(text)
    print(text)


def has_translate(runs: list[dict[str, Any]]) -> bool:
    return bool(records_of(runs))


def records_of(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The translation records of every run."""
    return [r for run in runs for r in run["records"] if r["workload"] in MODES]


def _label(r: dict[str, Any]) -> str:
    return f"{r['subject']} ({r['framework']})" if r["system"] == "ours" else r["subject"]


def section(runs: list[dict[str, Any]]) -> str:
    """The tables, then the targets."""
    recs = records_of(runs)
    machine = next(run["environment"]["machine"] for run in runs)
    options = next(run["options"] for run in runs)
    torch_env = next((run["environment"] for run in runs if run["environment"]["framework"] == "torch"), {})
    native = f", impl_torch `native_bf16={torch_env['native_bf16']}`" if "native_bf16" in torch_env else ""
    lines = [f"{machine['cpu']}, {machine['cores']} cores, {machine['date']}; `--config {options['config']}`, "
             f"{options.get('threads')} threads for torch and CTranslate2{native}. Each system ran in a process of "
             "its own; peak memory is that process's (framework included). A row's translations are compared with "
             "ours of its framework's run in the same dtype (float32 for CTranslate2's).", ""]
    for mode in MODES:
        for B in sorted({r["dims"]["B"] for r in recs if r["workload"] == mode}):
            lines += _table([r for r in recs if r["workload"] == mode and r["dims"]["B"] == B], mode, B)
    return "\n".join(lines + ["### Targets", "", *targets(recs), ""])


def _table(recs: list[dict[str, Any]], mode: str, B: int) -> list[str]:
    d = recs[0]["dims"]
    head = (f"#### {mode.removeprefix('translate_')}, B={B} ({d['sentences']} sentences of 10-40 tokens, "
            f"{d['new_tokens']} new tokens each, beam {d['beam_size']})")
    rows = [head, "", "| system | dtype | tokens/s | ms per pass | median peak MB (runs) | framework MB | "
            "translations = ours |",
            "|---|---|---|---|---|---|---|"]
    for r in sorted(recs, key=lambda r: -r["metrics"]["tokens_per_s"]):
        m = r["metrics"]
        same = "(ours)" if r["system"] == "ours" else {True: "yes", False: "no", None: "-"}[
            r.get("same_translations_as_ours")]
        rows.append(f"| {_label(r)} | {r['dtype']} | {m['tokens_per_s']:.0f} | {r['timing']['median_s'] * 1e3:.0f} "
                    f"| {np.median(peaks(r)):.0f} ({len(peaks(r))}) | {m['framework_rss_mb']:.0f} | {same} |")
    return rows + [""]


def targets(recs: list[dict[str, Any]]) -> list[str]:
    """One line per (mode, B, backend, dtype): ours / Marian in speed and peak memory; then ours in the fastest
    backend against CTranslate2's fastest compute type."""
    lines = []
    for mode in MODES:
        for B in sorted({r["dims"]["B"] for r in recs if r["workload"] == mode}):
            mine = [r for r in recs if r["workload"] == mode and r["dims"]["B"] == B]
            ours = [r for r in mine if r["system"] == "ours"]
            for r in ours:
                hf = next((p for p in mine if p["system"] == "transformers" and p["dtype"] == r["dtype"]), None)
                if hf:
                    memory = judge_peaks(peaks(r), peaks(hf)).cell()
                    lines.append(f"- {mode} B={B}, {_label(r)} {r['dtype']}: " + _speed(r, hf, 1.0, "Marian")
                                 + f"; peak memory / Marian's {memory} (medians, [lowest / highest, highest / "
                                 "lowest] over the runs; target <= 1)")
            ct2 = [p for p in mine if p["system"] == "ctranslate2"]
            if ours and ct2:
                best, fastest = (max(x, key=lambda r: r["metrics"]["tokens_per_s"]) for x in (ours, ct2))
                lines.append(f"- {mode} B={B}, the fastest of ours, {_label(best)} {best['dtype']}: "
                             + _speed(best, fastest, 0.5, f"CTranslate2 {fastest['dtype']}"))
    return lines


def summary(recs: list[dict[str, Any]]) -> list[str]:
    """A table of our backends by (mode, B): ours / Marian tokens/s, the median over rounds, bf16 then fp32."""
    cols = [(mode, B) for mode in MODES for B in sorted({r["dims"]["B"] for r in recs if r["workload"] == mode})]
    lines = ["| ours / Marian tokens/s, bf16 / fp32 | " + " | ".join(
        f"{m.removeprefix('translate_')} B={B}" for m, B in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for label in dict.fromkeys(_label(r) for r in recs if r["system"] == "ours"):
        cells = []
        for mode, B in cols:
            mine = [r for r in recs if r["workload"] == mode and r["dims"]["B"] == B]
            cells.append(" / ".join(_median(mine, label, dtype) for dtype in ("bfloat16", "float32")))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _median(recs: list[dict[str, Any]], label: str, dtype: str) -> str:
    ours = next((r for r in recs if r["system"] == "ours" and _label(r) == label and r["dtype"] == dtype), None)
    hf = next((p for p in recs if p["system"] == "transformers" and p["dtype"] == dtype), None)
    if not (ours and hf):
        return "-"
    if len(hf["times_s"]) != len(ours["times_s"]):
        return f"{ours['metrics']['tokens_per_s'] / hf['metrics']['tokens_per_s']:.2f}"
    return f"{judge(paired(hf['times_s'], ours['times_s']), 1.0, at_most=False).ratio:.2f}"


def _speed(ours: dict[str, Any], peer: dict[str, Any], target: float, name: str) -> str:
    """"<name>'s tokens/s x 1.23× [1.1, 1.3] ✓ ...", speed as the inverse time ratio per round; rounds that do not
    pair (as many in each) judge nothing."""
    if len(peer["times_s"]) != len(ours["times_s"]):
        r = ours["metrics"]["tokens_per_s"] / peer["metrics"]["tokens_per_s"]
        return (f"{r:.2f}x {name}'s tokens/s (undecided: {len(ours['times_s'])} and {len(peer['times_s'])} rounds, "
                "not paired)")
    v = judge(paired(peer["times_s"], ours["times_s"]), target, at_most=False)
    return f"{name}'s tokens/s x {v.cell()} (median over rounds, 10-90% interval; target >= {target})"


if __name__ == "__main__":
    main()
