"""Do backends translate one checkpoint identically? Only where the decisions' margins allow it.

Two conformant backends may pick different tokens where two candidates' logits are closer than the rounding
each is allowed. The NumPy reference decodes the same sources exactly (float64) and judges each emitted token's
margin against the logits tolerance at its position (``spec.decisions``): on a *decisive* sentence every
conformant backend must emit the reference's exact token ids; the others may differ.
"""

from __future__ import annotations

import numpy as np

from spec.config import Config
from spec.decisions import Decisions, greedy_decisions
from text.tokenizer import Tokenizer
from text.translate import pad_rows, source_ids


def reference_translations(config: Config, params: dict[str, np.ndarray], tokenizer: Tokenizer,
                           sentences: list[str]) -> tuple[Decisions, list[str]]:
    """``spec.decisions.greedy_decisions`` of ``sentences`` (each within the search limit, ``fitting``),
    right-padded in input order: -> (its decisions, its tokens detokenised)."""
    src = pad_rows(source_ids(tokenizer, sentences, config.max_len), config.pad_id)          # (B, S)
    ref = greedy_decisions(params, src, config)
    return ref, tokenizer.decode(ref.tokens)


def judged(ref: Decisions, rows: dict[str, list]) -> dict:
    """Each backend's greedy token ids (``{name: rows}``, each row (L_b,) int) against the reference's decisions:
    how many sentences were decisive, and per backend which sentences equal the reference's and which decisive
    ones do not (row indices)."""
    equal = {name: ref.equal(r) for name, r in rows.items()}
    return {"sentences": len(ref.tokens), "decisive": int(ref.decisive.sum()),
            "decisive_decisions": float(ref.decisive_steps[ref.emitted].mean()),
            "median_tolerance": float(np.median(ref.tolerances[ref.emitted])),
            "median_margin": float(np.median(ref.margins[ref.emitted])),
            "equal_to_reference": {k: int(v.sum()) for k, v in equal.items()},
            "decisive_differing": {k: np.flatnonzero(ref.decisive & ~v).tolist() for k, v in equal.items()}}


def fitting(tokenizer: Tokenizer, sentences: list[str], max_len: int) -> list[str]:
    """The sentences whose search gets the paper's limit, source length + 50 new tokens, within ``max_len``: on
    them the reference and a batched translation decode under the same per-sentence limits."""
    return [s for s, ids in zip(sentences, tokenizer.encode(sentences), strict=True) if len(ids) + 51 <= max_len]

