"""Which greedy decisions the contract decides: agreement of decoding judged per emitted token.

Two conformant backends may emit different tokens where the two best candidates' logits are closer than the
rounding each is allowed. The exact (float64) reference decodes greedily and, for each emitted token of each row
(up to and including its EOS), records the margin between the chosen and the runner-up logit after
``search.forbid_special`` (the gap of log-probabilities, which share one normaliser). The tolerance at that
position is ``tolerance.logits_tolerance_abs`` of the faithful reference's error there, on the teacher-forced
forward of the exact output: a conformant backend that has emitted the same prefix sees the same inputs, and its
logits at that position lie within that tolerance of the exact ones. A decision is *decisive* when its margin
exceeds ``tolerance.DECISION_MARGIN_FACTOR`` (2) times that tolerance, as neither logit can move by more than
the tolerance; a row is decisive when all its decisions are. Positions after a row's EOS are no decisions and
take no part in a tolerance. On a decisive row a conformant backend's greedy tokens equal the reference's.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from spec import reference, search, tolerance
from spec.config import Config
from spec.numerics import Numerics


@dataclasses.dataclass(frozen=True)
class Decisions:
    """The exact greedy output and its decisions.

    Fields:
        tokens: (B, L) int64, the exact greedy tokens (``search.greedy_search``), EOS included, right-padded.
        margins: (B, L) float64, chosen minus runner-up logit per emitted token; inf after the row's end.
        tolerances: (B, L) float64, the logits tolerance at that position; 0 after the row's end.
        lengths: (B,) int64, the tokens each row emits (its EOS included).
        pad_id: the config's padding id, which follows a row's end.
    """

    tokens: np.ndarray
    margins: np.ndarray
    tolerances: np.ndarray
    lengths: np.ndarray
    pad_id: int

    @property
    def emitted(self) -> np.ndarray:
        """(B, L) bool: the positions of emitted tokens, each a decision."""
        return np.arange(self.tokens.shape[1]) < self.lengths[:, None]

    @property
    def decisive_steps(self) -> np.ndarray:
        """(B, L) bool: decisions whose margin exceeds ``DECISION_MARGIN_FACTOR`` times their tolerance (True
        after a row's end)."""
        return self.margins > tolerance.DECISION_MARGIN_FACTOR * self.tolerances

    @property
    def decisive(self) -> np.ndarray:
        """(B,) bool: rows whose every decision is decisive."""
        return self.decisive_steps.all(axis=1)

    def equal(self, rows: list[np.ndarray]) -> np.ndarray:
        """(B,) bool: whether each row of a backend's greedy tokens (each (L_b,) int, right-padded with any
        number of pads) emits the reference's tokens and nothing more.

        Raises:
            ValueError: if the number of rows differs from the reference's.
        """
        if len(rows) != len(self.tokens):
            raise ValueError(f"{len(rows)} rows given for {len(self.tokens)} decided ones")
        return np.array([np.array_equal(np.asarray(r)[:n], t[:n]) and bool(np.all(np.asarray(r)[n:] == self.pad_id))
                         for r, t, n in zip(rows, self.tokens, self.lengths, strict=True)])


def greedy_decisions(params: dict[str, np.ndarray], src: np.ndarray, config: Config,
                     max_new_tokens: int | None = None) -> Decisions:
    """The exact greedy decoding of src (B, S) with each decision's margin and tolerance (``config.dtype``'s).

    Raises:
        ValueError: from ``search.greedy_search`` for bad ``src`` or limits.
    """
    p = reference.as_float64(params, config)
    trace: dict = {}
    tokens = search.greedy_search(p, src, config, Numerics("exact"), max_new_tokens, trace=trace)     # (B, L)
    B, L = tokens.shape
    margins = np.full((B, L), np.inf)
    for b, row in enumerate(trace["rows"]):
        gaps = [gap for gap, _ in row.get("decisions", [])]  # one per emitted token, in order
        margins[b, :len(gaps)] = gaps
    emitted = np.cumsum(tokens == config.eos_id, axis=1) - (tokens == config.eos_id) == 0   # up to the EOS
    emitted &= tokens != config.pad_id
    tgt_in = np.concatenate([np.full((B, 1), config.bos_id), tokens[:, :-1]], axis=1)       # (B, L)
    tgt_in = np.where(emitted, tgt_in, config.pad_id)
    exact = reference.forward(p, src, tgt_in, config, Numerics("exact"))                     # (B, L, V)
    faithful = reference.forward(p, src, tgt_in, config, Numerics(config.dtype))
    tolerances = np.zeros((B, L))
    for b, t in zip(*np.nonzero(emitted), strict=True):
        stats = tolerance.error_stats(faithful[b, t], exact[b, t], config.dtype)
        tolerances[b, t] = tolerance.logits_tolerance_abs(stats)
    return Decisions(tokens, np.where(emitted, margins, np.inf), tolerances,
                     emitted.sum(axis=1), config.pad_id)
