"""The targets of ``nox -s bench``, one row per framework, each judged by ``bench.verdict`` on the rounds of the
subjects timed together: the table of ``bench.report``."""

from __future__ import annotations

from typing import Any

import numpy as np

from bench import verdict


def table(runs: list[dict[str, Any]]) -> str:
    """The targets, one row per framework: each ratio's median over rounds, its interval and verdict
    (``bench.verdict``)."""
    rows = ["| | bf16 forward / own fp32 ≤ 1 | bf16 forward / peer's best ≤ 1 | mixed training step / peer's ≤ 1 | "
            "cached / recomputed, first 32 ≥ 5 | step at last token / at first window ≤ 1.10 | "
            "bf16 / fp32 decoding speed ≥ 1 | beam 4 / greedy time ≤ 3 |", "|---|---|---|---|---|---|---|---|"]
    for fw in frameworks(runs):
        ours = f"impl_{fw}"
        bf, fp = (one(runs, "forward", framework=fw, subject=ours, dtype=d) for d in ("bfloat16", "float32"))
        peers = [r for r in records(runs, "forward", framework=fw) if r["subject"] != ours]
        peer = min(peers, key=lambda r: r["timing"]["median_s"], default=None)
        train = {r["subject"] == ours: r for r in records(runs, "train", framework=fw, dtype="bfloat16")}
        steps = one(runs, "greedy_steps", framework=fw, dtype="bfloat16")
        greedy = {d: one(runs, "greedy", framework=fw, dtype=d) for d in ("bfloat16", "float32")}
        beam = one(runs, "beam", framework=fw, dtype="bfloat16")
        cells = [_versus(bf, fp, 1.0), _versus(bf, peer, 1.0) + (f" ({peer['subject']} {peer['dtype']})" if peer
                                                                  else ""),
                 _versus(train.get(True), train.get(False), 1.0),
                 _judged(steps and steps.get("cache_speedup_rounds"), 5.0, at_most=False),
                 _judged(steps and steps.get("step_growth_rounds"), 1.10),
                 _versus(greedy["float32"], greedy["bfloat16"], 1.0, at_most=False),
                 _judged(beam and "greedy_times_s" in beam and verdict.paired(beam["timing"]["times_s"],
                                                                              beam["greedy_times_s"]), 3.0)]
        rows.append(f"| {ours} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + ("\n\nbf16 rows; the fp32 figures are in docs/speed.md's tables. Each cell: the median "
                              "over rounds of the per-round ratio, the 10-90% interval of the rounds, and ✓ or ✗ "
                              "where the whole interval lies on one side of the target, \"undecided\" where it "
                              "covers it (`bench.verdict`: subjects timed together, rounds added until decided, "
                              f"at least {verdict.MIN_ROUNDS} and at most {verdict.MAX_ROUNDS}; a peak-memory "
                              f"verdict compares every process's peak, at least {verdict.MIN_RUNS} per subject, ✓ "
                              "only where ours' highest is at most the peer's lowest). The cache's speed-up and the "
                              "step's growth are "
                              "judged over rounds of the whole step series; bf16 over fp32 decoding is the fp32 "
                              "greedy search's time over the bf16 one's.")


def _versus(a: dict[str, Any] | None, b: dict[str, Any] | None, target: float, at_most: bool = True) -> str:
    """The verdict of a's time over b's, paired by round; "—" where either is missing or was timed apart."""
    if not (a and b and "times_s" in a["timing"] and "times_s" in b["timing"]):
        return "—"
    if len(a["timing"]["times_s"]) != len(b["timing"]["times_s"]):
        return "—"
    return _judged(verdict.paired(a["timing"]["times_s"], b["timing"]["times_s"]), target, at_most)


def _judged(ratios: list[float] | None, target: float, at_most: bool = True) -> str:
    return verdict.judge(ratios, target, at_most).cell() if ratios else "—"


def records(runs: list[dict[str, Any]], workload: str, **where: Any) -> list[dict[str, Any]]:
    """The records of ``workload`` whose fields equal ``where``'s, over every run."""
    return [rec for r in runs for rec in r["records"]
            if rec["workload"] == workload and all(rec.get(k) == v for k, v in where.items())]


def one(runs: list[dict[str, Any]], workload: str, **where: Any) -> dict[str, Any] | None:
    return next(iter(records(runs, workload, **where)), None)


def frameworks(runs: list[dict[str, Any]]) -> list[str]:
    return [r["environment"]["framework"] for r in runs]


def memory_table(runs: list[dict[str, Any]]) -> str:
    """Peak resident memory per workload (``bench.memory``), ours beside the peer where one runs the workload
    here, medians over the processes: the target ours <= the peer's, judged on every process's peak
    (``bench.verdict.judge_peaks``)."""
    rows = ["| framework | workload | dtype | ours MiB | framework alone MiB | peer | peer MiB | ours / peer ≤ 1 |",
            "|---|---|---|---|---|---|---|---|"]
    for fw in frameworks(runs):
        mine = records(runs, "memory", framework=fw)
        for r in (r for r in mine if r["subject"].startswith("impl_")):
            peer = next((p for p in mine if p["of"] == r["of"] and p["dtype"] == r["dtype"]
                         and not p["subject"].startswith("impl_")), None)
            cell = verdict.judge_peaks(verdict.peaks(r), verdict.peaks(peer)).cell() if peer else "—"
            rows.append(f"| {fw} | {r['of']} | {r['dtype']} | {np.median(verdict.peaks(r)):,.0f} | "
                        f"{r['metrics']['framework_rss_mb']:,.0f} | {peer['subject'] if peer else '—'} | "
                        f"{format(np.median(verdict.peaks(peer)), ',.0f') if peer else '—'} | {cell} |")
    return "\n".join(rows) + ("\n\nEach subject ran the workload twice (the first call compiles) alone in a process "
                              "of its own, in `--memory-runs` processes interleaved with the others'; peak memory is "
                              "a process's, the framework's own included (the column beside it: the process before "
                              "the model was built), and the MiB shown the median over the processes. The verdict: "
                              "the ratio of the medians, [ours' lowest / the peer's highest, ours' highest / the "
                              "peer's lowest], ✓ only where ours' highest peak is at or below the peer's lowest, ✗ "
                              "only where ours' lowest is above the peer's highest, undecided otherwise or with "
                              f"fewer than {verdict.MIN_RUNS} processes each (`bench.verdict.judge_peaks`). "
                              "`bfloat16` training is mixed precision (fp32 master weights). The decoding peers' "
                              "memory is in the translation section.")
