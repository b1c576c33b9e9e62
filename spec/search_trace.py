"""The trace of a search (``spec.search``): the gaps between scores whose order decided its output.

``trace["margin"]`` is the smallest such gap, ``trace["rows"]`` one dict per sequence with its own ``margin`` and
its ``decisions`` as (gap, reach), ``reach`` the best score, as a finished hypothesis, that a hypothesis on either
side of the decision can still reach. Every function here does nothing without a trace (``None``).
"""

from __future__ import annotations

import numpy as np

from spec.config import Config

Trace = dict | None


def note_gap(row: Trace, sorted_scores: np.ndarray, i: int, reach: float = np.inf) -> None:
    """Record in a row's trace the gap between sorted scores i and i+1, which decided a cut."""
    if row is None or i + 1 >= sorted_scores.size:
        return
    a, b = sorted_scores[i], sorted_scores[i + 1]
    if np.isfinite(a) and np.isfinite(b):
        note_margin(row, float(a - b), reach)


def note_margin(row: Trace, gap: float, reach: float = np.inf) -> None:
    """Record in a row's trace a decision of gap ``gap`` whose sides reach at most ``reach``."""
    if row is not None:
        row["margin"] = min(row.get("margin", np.inf), gap)
        row.setdefault("decisions", []).append((gap, float(reach)))


def row_traces(trace: Trace, B: int) -> list[Trace]:
    """One trace dict per sequence, listed in ``trace["rows"]`` (or Nones without a trace)."""
    if trace is None:
        return [None] * B
    trace["rows"] = [{} for _ in range(B)]
    return trace["rows"]


def overall_margin(trace: Trace) -> None:
    """The trace's ``margin``: the smallest of its rows'."""
    if trace is not None:
        trace["margin"] = min((r.get("margin", np.inf) for r in trace["rows"]), default=np.inf)


def trace_beam_step(trace: dict, cand: np.ndarray, order: np.ndarray, k: int, n: int, c: Config, lp_t: float,
                    kth_finished: float, max_lp: float) -> None:
    """Record the gaps that decide one beam step of ``spec.search`` (its module docstring): ``cand`` (k * V,) the
    step's candidate log-probabilities, ``order`` their descending order, ``n`` the candidates kept (2k).

    The top 2k candidates hold at most k EOS candidates (one per beam), so the
    alive set is the top k non-EOS candidates overall: the gap at that cut
    decides it; the better of its two sides reaches at most its log-probability
    over the length penalty at the limit. An EOS candidate matters if its
    normalised score could enter the finished top k; then its distance to the
    2k cut decides whether it is considered at all.
    """
    eos = order % c.vocab_size == c.eos_id
    alive = cand[order[~eos]]
    note_gap(trace, alive, k - 1, alive[k - 1] / max_lp if alive.size >= k else np.inf)
    hi, lo = cand[order[n - 1]], cand[order[n]]
    for rank in np.flatnonzero(eos):
        score = cand[order[rank]]
        if np.isfinite(score) and score / lp_t >= kth_finished:
            note_margin(trace, float(score - lo if rank < n else hi - score), max(score, hi) / max_lp)
