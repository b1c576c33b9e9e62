"""Verdicts that noise cannot decide: a target on a ratio of two timings is judged on the spread of that ratio.

Two subjects timed together (``common.measure_together``) give one ratio per round of their interleaved repeats;
a drift of the machine inside a round weighs on both, between rounds it moves the ratio. A target is met (✓) when
the ``LOW``-``HIGH`` quantile interval of those ratios lies wholly on its side, missed (✗) when wholly on the
other, and undecided otherwise: more rounds (up to ``MAX_ROUNDS``) narrow the interval, and a ratio whose
interval still covers the target at the cap is reported as undecided rather than given a verdict. Fewer than
``MIN_ROUNDS`` rounds decide nothing: the quantiles of two or three ratios are those ratios themselves.

Peak memory is one figure per process, and it moves between processes of the same subject (allocator and thread
timing, the framework's lazy imports): ``judge_peaks`` takes every process's peak of each subject and compares
their ranges, not two figures. Ours is at most the peer's (✓) only when ours' highest peak is at or below the
peer's lowest, above it (✗) only when ours' lowest is above the peer's highest, undecided where the ranges
overlap: no run's noise can then tip the verdict. The interval shown is [ours' lowest / peer's highest, ours'
highest / peer's lowest], the ratio the medians'. Fewer than ``MIN_RUNS`` processes of either subject decide
nothing: one or two peaks show no spread to judge against.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

LOW, HIGH = 0.1, 0.9   # the interval: the 10% and 90% quantiles of the per-round ratios
MIN_ROUNDS = 5         # rounds a verdict needs: below it, undecided
MAX_ROUNDS = 25        # rounds a measurement adds, at most, to decide a verdict
MIN_RUNS = 3           # processes per subject a peak-memory verdict needs: below it, undecided
MET, MISSED, UNDECIDED = "✓", "✗", "undecided"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A target ``ratio <= target`` (``at_most``) or ``>= target`` judged on ``ratios`` (one per round), or on two
    subjects' peaks (``judge_peaks``: ``rounds`` then counts the processes of the subject with fewer)."""

    ratio: float   # the median ratio
    low: float
    high: float
    rounds: int
    target: float
    at_most: bool
    needs: int = MIN_ROUNDS   # rounds (or runs) a verdict needs
    unit: str = "round"

    @property
    def outcome(self) -> str:
        if self.rounds < self.needs:
            return UNDECIDED
        good = self.high <= self.target if self.at_most else self.low >= self.target
        bad = self.low > self.target if self.at_most else self.high < self.target
        return MET if good else MISSED if bad else UNDECIDED

    def cell(self) -> str:
        """``1.23× [1.10, 1.31] ✗``: the median ratio, its interval and the outcome; ``... undecided: 2 rounds``
        where there were too few to judge."""
        few = f": {self.rounds} {self.unit}{'s' * (self.rounds != 1)}" if self.rounds < self.needs else ""
        return f"{self.ratio:.2f}× [{self.low:.2f}, {self.high:.2f}] {self.outcome}{few}"

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "outcome": self.outcome}


def judge(ratios: Sequence[float], target: float, at_most: bool = True) -> Verdict:
    """The verdict of per-round ``ratios`` (at least one) on ``target``.

    Raises:
        ValueError: for no ratios, or one that is not finite and positive.
    """
    r = np.asarray(ratios, np.float64)
    if r.size == 0 or not np.all(np.isfinite(r) & (r > 0)):
        raise ValueError(f"ratios must be finite and positive, at least one; got {list(ratios)}")
    low, high = np.quantile(r, [LOW, HIGH])
    return Verdict(float(np.median(r)), float(low), float(high), int(r.size), float(target), at_most)


def judge_peaks(ours: Sequence[float], peer: Sequence[float]) -> Verdict:
    """The verdict of ours' peak memory at most the peer's from every process's peak of each (MiB, at least one
    each): ✓ only where ours' highest is at or below the peer's lowest, ✗ only where ours' lowest is above the
    peer's highest, and undecided with fewer than ``MIN_RUNS`` of either.

    Raises:
        ValueError: for a subject with no peak, or one that is not finite and positive.
    """
    o, p = (np.asarray(x, np.float64) for x in (ours, peer))
    if not (o.size and p.size and np.all(np.isfinite(o) & (o > 0)) and np.all(np.isfinite(p) & (p > 0))):
        raise ValueError(f"peaks must be finite and positive, at least one each; got {list(ours)}, {list(peer)}")
    return Verdict(float(np.median(o) / np.median(p)), float(o.min() / p.max()), float(o.max() / p.min()),
                   int(min(o.size, p.size)), 1.0, True, MIN_RUNS, "run")


def peaks(record: dict) -> list[float]:
    """Every process's peak resident memory (MiB) of a bench record: its ``peak_rss_runs_mb``, or for a record
    written before each run's figure was kept, its one ``metrics["peak_rss_mb"]``."""
    return list(record.get("peak_rss_runs_mb", [record["metrics"]["peak_rss_mb"]]))


def paired(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Per-round ratios a / b of two subjects' repeats timed in the same rounds.

    Raises:
        ValueError: if the two have different numbers of repeats (not timed together).
    """
    if len(a) != len(b):
        raise ValueError(f"{len(a)} and {len(b)} repeats: ratios pair repeats of the same rounds")
    return [x / y for x, y in zip(a, b, strict=True)]


def decided(pairs: list[tuple[Sequence[float], Sequence[float], float, bool]]) -> bool:
    """Whether every (a, b, target, at_most) of ``pairs`` has a verdict: the stopping rule of a measurement."""
    return all(judge(paired(a, b), t, m).outcome != UNDECIDED for a, b, t, m in pairs)


def best(times: list[list[float]], indices: list[int]) -> int:
    """The index of ``indices`` whose repeats have the lowest median: the fastest peer so far."""
    return min(indices, key=lambda i: float(np.median(times[i])))


def versus(ours: int, others: list[int], target: float = 1.0, at_most: bool = True):
    """A stopping rule for ``common.measure_together``: decided once ``ours`` over each of ``others`` (the fastest
    of them, for a peer's best: ``[best]`` is re-chosen each round by the caller's lists) has a verdict."""
    def until(times: list[list[float]]) -> bool:
        return decided([(times[ours], times[i], target, at_most) for i in others])
    return until


def forward_until(which: list[tuple[str, bool]]):
    """The forward's stopping rule for subjects ``which`` ((dtype, peer?) each): our bf16 forward over our fp32
    one and over the fastest peer, each <= 1."""
    ours = {dtype: i for i, (dtype, peer) in enumerate(which) if not peer}
    peers = [i for i, (_, peer) in enumerate(which) if peer]

    def until(times: list[list[float]]) -> bool:
        if "bfloat16" not in ours:
            return True
        others = [ours["float32"]] if "float32" in ours else []
        return versus(ours["bfloat16"], others + ([best(times, peers)] if peers else []))(times)
    return until
