"""``bench.verdict``: a target is met or missed only where the 10-90% interval of the per-round ratios lies on one
side of it; measurements add rounds until their verdicts are decided, up to a cap; a peak-memory verdict only where
the subjects' peaks over at least three processes each do not overlap."""

from __future__ import annotations

import itertools
import statistics

import pytest

from bench import verdict
from bench.common import measure_together


@pytest.mark.parametrize("ratios, target, at_most, outcome", [
    ([0.90, 0.95, 0.97, 0.99, 0.96], 1.0, True, "✓"),
    ([0.90, 0.95, 1.02, 1.05, 0.97], 1.0, True, "undecided"),     # the spread covers the target
    ([1.02, 1.04, 1.05, 1.10, 1.03], 1.0, True, "✗"),
    ([5.5, 6.0, 6.1, 5.8, 5.9], 5.0, False, "✓"),
    ([4.0, 4.5, 4.9, 4.2, 4.4], 5.0, False, "✗"),
    ([0.5, 0.5, 0.5, 0.5], 1.0, True, "undecided"),               # fewer than MIN_ROUNDS rounds decide nothing
    ([2.0, 2.0], 1.0, True, "undecided"),
])
def test_a_verdict_needs_the_whole_interval_on_one_side(ratios, target, at_most, outcome):
    v = verdict.judge(ratios, target, at_most)
    assert v.outcome == outcome and v.rounds == len(ratios) and v.low <= v.ratio <= v.high
    few = f": {v.rounds} rounds" if v.rounds < verdict.MIN_ROUNDS else ""
    assert v.cell().endswith(outcome + few), v.cell()


def test_one_outlier_round_in_ten_does_not_decide_the_verdict():
    """The interval drops the rounds beyond its quantiles: one disturbed round of ten does not move it across."""
    assert verdict.judge([0.9] * 9 + [1.5], 1.0).outcome == "✓"


def test_ratios_pair_the_repeats_of_one_round():
    assert verdict.paired([2.0, 3.0], [1.0, 2.0]) == [2.0, 1.5]
    with pytest.raises(ValueError, match="3 and 2 repeats"):
        verdict.paired([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="finite and positive"):
        verdict.judge([], 1.0)


def test_a_measurement_adds_rounds_until_decided_and_stops_at_the_cap():
    calls = itertools.count()

    def until_after(n):  # decided once n rounds have run
        return lambda times: len(times[0]) >= n

    timings = measure_together([lambda: next(calls)], repeats=3, budget_s=0.0, until=until_after(7))
    assert len(timings[0].times_s) == 7
    timings = measure_together([lambda: next(calls)], repeats=3, budget_s=0.0, until=lambda times: False)
    assert len(timings[0].times_s) == verdict.MAX_ROUNDS


def test_the_forward_rule_compares_bf16_with_fp32_and_the_fastest_peer():
    which = [("bfloat16", False), ("bfloat16", True), ("float32", False), ("float32", True)]
    until = verdict.forward_until(which)
    fast, slow = [1.0] * 5, [2.0, 2.1, 1.9, 2.0, 2.2]
    assert until([fast, slow, slow, [3.0] * 5])                  # ours bf16 ahead of fp32 and of the best peer
    assert not until([fast, [1.0, 0.95, 1.05, 1.0, 0.97], slow, slow])   # the best peer: the interval covers 1
    assert not until([fast[:3], slow[:3], slow[:3], [3.0] * 3])  # three rounds decide nothing


@pytest.mark.parametrize("ours, peer, outcome", [
    ([900, 905, 910], [1000, 1001, 1003], "✓"),
    ([990, 1000, 1000], [1000, 1010, 1020], "✓"),           # ours' highest at the peer's lowest
    ([900, 1005, 910], [1000, 1001, 1003], "undecided"),    # one run of ours above the peer's lowest
    ([1100, 1004, 1110], [1000, 1001, 1003], "✗"),
    ([1100, 1000, 1110], [1000, 1001, 1003], "undecided"),  # one run of ours within the peer's range
    ([900, 905], [1000, 1001, 1003], "undecided"),          # fewer than MIN_RUNS processes decide nothing
    ([900], [1000], "undecided"),
])
def test_a_memory_verdict_rests_on_every_runs_peak(ours, peer, outcome):
    v = verdict.judge_peaks(ours, peer)
    assert v.outcome == outcome and v.rounds == min(len(ours), len(peer))
    assert v.low == min(ours) / max(peer) <= v.ratio <= v.high == max(ours) / min(peer)
    assert v.ratio == pytest.approx(statistics.median(ours) / statistics.median(peer))
    few = v.rounds < verdict.MIN_RUNS
    assert v.cell().endswith(f"undecided: {v.rounds} run{'s' * (v.rounds > 1)}" if few else outcome), v.cell()
    with pytest.raises(ValueError, match="at least one each"):
        verdict.judge_peaks(ours, [])


def test_a_record_without_each_runs_peak_is_one_run():
    assert verdict.peaks({"metrics": {"peak_rss_mb": 700.0}}) == [700.0]
    runs = {"metrics": {"peak_rss_mb": 701.0}, "peak_rss_runs_mb": [700.0, 701.0, 705.0]}
    assert verdict.peaks(runs) == [700.0, 701.0, 705.0]


def test_a_measurement_past_its_budget_still_runs_the_rounds_a_verdict_needs():
    """The budget cuts the rounds short of ``repeats`` only once a verdict has the rounds it needs."""
    timings = measure_together([lambda: None, lambda: None], repeats=8, budget_s=0.0)
    assert [len(t.times_s) for t in timings] == [verdict.MIN_ROUNDS] * 2
    assert len(measure_together([lambda: None], repeats=2, budget_s=0.0)[0].times_s) == 2
