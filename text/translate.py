"""Text in, text out: sentences translated by any backend through the common API (``spec.api``).

``translate(T, model, tokenizer, sentences)`` encodes with the shared subword model, sorts the sentences by
length (so a batch pads little and a compiling backend sees few shapes), runs ``T.beam_search`` with the paper's
settings (beam 4, length penalty alpha 0.6, at most source length + 50 new tokens; section 6.1) or
``T.greedy_search``, and decodes back to text in the input order.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from text.tokenizer import Tokenizer

BEAM_SIZE, ALPHA = 4, 0.6          # section 6.1
BATCH = 64


def host(x: Any) -> np.ndarray:
    """A framework array (torch, JAX, TensorFlow) or a NumPy array, as NumPy."""
    if hasattr(x, "detach"):        # torch: a tensor that requires grad has no NumPy view until detached
        x = x.detach().cpu()
    return np.asarray(x)


def source_ids(tokenizer: Tokenizer, sentences: Sequence[str], max_len: int, truncate: bool = False
               ) -> list[list[int]]:
    """Each sentence's subword ids followed by EOS; with ``truncate``, a sentence longer than the model reads is
    cut to its first ``max_len - 1`` subwords.

    Raises:
        ValueError: naming the (1-based) line of a sentence that is empty, or (without ``truncate``) longer than
            the model's ``max_len`` allows (its ids and EOS must fit).
    """
    ids = tokenizer.encode(list(sentences))
    for i, row in enumerate(ids, 1):
        if not row:
            raise ValueError(f"line {i}: empty sentence; nothing to translate")
        if len(row) + 1 > max_len and not truncate:
            raise ValueError(f"line {i}: {len(row)} subwords; the model reads at most max_len - 1 = {max_len - 1}")
    return [row[:max_len - 1] + [tokenizer.eos_id] for row in ids]


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int) -> np.ndarray:
    """Rows of ids right-padded with ``pad_id`` to the longest: (B, S) int64."""
    out = np.full((len(rows), max(map(len, rows))), pad_id, np.int64)
    for r, row in enumerate(rows):
        out[r, :len(row)] = row
    return out


def translate(T: ModuleType, model: Any, tokenizer: Tokenizer, sentences: Sequence[str], *,
              beam_size: int = BEAM_SIZE, alpha: float = ALPHA, batch_size: int = BATCH, truncate: bool = False
              ) -> list[str]:
    """Translations of ``sentences`` (detokenised text, input order) by ``model`` of the impl module ``T``:
    ``search_ids``'s tokens, detokenised.

    Raises:
        ValueError: from ``source_ids`` for an empty or over-long sentence, before any search.
    """
    return tokenizer.decode(search_ids(T, model, tokenizer, sentences, beam_size=beam_size, alpha=alpha,
                                       batch_size=batch_size, truncate=truncate))


def search_ids(T: ModuleType, model: Any, tokenizer: Tokenizer, sentences: Sequence[str], *,
               beam_size: int = BEAM_SIZE, alpha: float = ALPHA, batch_size: int = BATCH, truncate: bool = False
               ) -> list[np.ndarray]:
    """The token ids ``model`` of the impl module ``T`` emits for each of ``sentences``, in input order: each
    (L_b,) int64, EOS included, right-padded with pad as its batch was.

    ``beam_size`` 1 is greedy search (``T.greedy_search``), otherwise ``T.beam_search(model, src, beam_size,
    alpha)``; each with the API's default limit, source length + 50 new tokens, or ``max_len`` for a batch whose
    longest source leaves less room. ``truncate`` as ``source_ids``.

    Raises:
        ValueError: from ``source_ids`` for an empty or over-long sentence, before any search.
    """
    c = model.config
    rows = source_ids(tokenizer, sentences, c.max_len, truncate)
    order = np.argsort([len(r) for r in rows], kind="stable")
    out: list[np.ndarray] = [np.zeros(0, np.int64)] * len(rows)
    for start in range(0, len(rows), batch_size):
        idx = order[start:start + batch_size]
        src = pad_rows([rows[i] for i in idx], c.pad_id)                                 # (B, S)
        # The paper's limit, source length + 50 (the API's default), where the model's max_len allows it.
        limit = None if src.shape[1] + 50 <= c.max_len else c.max_len
        if beam_size == 1:
            tokens = T.greedy_search(model, src, limit)                                   # (B, L)
        else:
            tokens = T.beam_search(model, src, beam_size, alpha, limit)                   # (B, L)
        for i, row in zip(idx, host(tokens), strict=True):
            out[i] = row.astype(np.int64)
    return out
