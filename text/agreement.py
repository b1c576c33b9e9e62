"""Do backends translate one checkpoint identically? Only where the decisions' margins allow it.

Two conformant backends may pick different tokens where two candidates' logits are closer than the rounding
each is allowed (``spec.tolerance``). The NumPy reference decodes the same sources exactly (float64) and
records, per sentence, the smallest gap between the chosen token and the runner-up over all its steps
(``spec.search``'s trace). A sentence whose margin exceeds twice the logits tolerance of the model's dtype is
*decisive*: every conformant backend must return the reference's exact tokens for it; the others may differ.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from spec import reference, search, tolerance
from spec.config import Config
from spec.numerics import Numerics
from text.tokenizer import Tokenizer
from text.translate import pad_rows, source_ids


@dataclasses.dataclass(frozen=True)
class Decisions:
    """The exact greedy tokens (B, L) int64, each row's decision margin (B,), and the logits tolerance."""

    tokens: np.ndarray
    margins: np.ndarray
    tolerance: float

    @property
    def decisive(self) -> np.ndarray:
        """(B,) bool: rows whose every decision is at least twice the tolerance apart."""
        return self.margins > 2 * self.tolerance


def reference_greedy(config: Config, params: dict[str, np.ndarray], src: np.ndarray,
                     max_new_tokens: int | None = None) -> Decisions:
    """Exact greedy decoding of src (B, S) by the reference, with margins and the tolerance of ``config.dtype``:
    the teacher-forced logits of the exact output, exact against faithful, give the faithful error."""
    exact, faithful = Numerics("exact"), Numerics(config.dtype)
    p = reference.as_float64(params, config)
    trace: dict = {}
    tokens = search.greedy_search(p, src, config, exact, max_new_tokens, trace=trace)       # (B, L)
    tgt_in = np.concatenate([np.full((len(src), 1), config.bos_id), tokens[:, :-1]], axis=1)
    tgt_in = np.where(tgt_in == config.eos_id, config.pad_id, tgt_in)                       # (B, L)
    want = reference.forward(p, src, tgt_in, config, exact)                                  # (B, L, V)
    got = reference.forward(p, src, tgt_in, config, faithful)
    tol = tolerance.logits_tolerance_abs(tolerance.error_stats(got, want, config.dtype))
    margins = np.array([row.get("margin", np.inf) for row in trace["rows"]])
    return Decisions(tokens, margins, tol)


def reference_translations(config: Config, params: dict[str, np.ndarray], tokenizer: Tokenizer,
                           sentences: list[str]) -> tuple[Decisions, list[str]]:
    """``reference_greedy`` of ``sentences`` (each within the search limit, ``fitting``), right-padded in input
    order: -> (its decisions, its tokens detokenised)."""
    src = pad_rows(source_ids(tokenizer, sentences, config.max_len), config.pad_id)          # (B, S)
    ref = reference_greedy(config, params, src)
    return ref, tokenizer.decode(ref.tokens)


def fitting(tokenizer: Tokenizer, sentences: list[str], max_len: int) -> list[str]:
    """The sentences whose search gets the paper's limit, source length + 50 new tokens, within ``max_len``: on
    them the reference and a batched translation decode under the same per-sentence limits."""
    return [s for s, ids in zip(sentences, tokenizer.encode(sentences), strict=True) if len(ids) + 51 <= max_len]

