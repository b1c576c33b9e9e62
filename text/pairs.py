"""Sentence pairs as ``text.batching`` holds them: subword ids checked, EOS appended to the source, and variable-length
rows kept flat (one array of ids with offsets and lengths, not one array per pair) and scattered into padded rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spec.config import Config


def examples(src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]],
             config: Config) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per pair, src = ids + [EOS] and tgt = ids (tgt_in and tgt_out are built per batch), each (n,) int64.

    Raises:
        ValueError: if the lists differ in length; or naming the first bad pair: an empty side, a side that with
            its EOS (BOS) exceeds ``config.max_len``, or an id outside [0, vocab_size) or equal to pad, BOS or EOS.
    """
    if len(src_ids) != len(tgt_ids):
        raise ValueError(f"examples: {len(src_ids)} source sentences for {len(tgt_ids)} target sentences")
    c = config
    for i, (s, t) in enumerate(zip(src_ids, tgt_ids, strict=True)):
        for side, ids in (("source", s), ("target", t)):
            if len(ids) == 0:
                raise ValueError(f"examples: pair {i} has an empty {side}")
            if len(ids) + 1 > c.max_len:
                raise ValueError(f"examples: pair {i}'s {side} has {len(ids)} tokens; with its "
                                 f"{'EOS' if side == 'source' else 'BOS / EOS'} it must fit max_len {c.max_len}")
    src, tgt = _ids("source", src_ids, c), _ids("target", tgt_ids, c)
    return [np.append(a, np.int64(c.eos_id)) for a in src], tgt


def _ids(side: str, rows: Sequence[Sequence[int]], c: Config) -> list[np.ndarray]:
    """The rows as (n,) int64 arrays.

    Raises:
        ValueError: naming the first pair whose ``side`` is not a 1-D sequence of ints in [0, vocab_size) other
            than pad, BOS and EOS.
    """
    out = []
    for i, row in enumerate(rows):
        a = np.asarray(row)
        if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"examples: pair {i}'s {side} is not a sequence of int ids (shape {a.shape}, "
                             f"dtype {a.dtype})")
        out.append(a.astype(np.int64))
    flat, offsets, _ = flatten_rows(out)
    bad = (flat < 0) | (flat >= c.vocab_size) | np.isin(flat, (c.pad_id, c.bos_id, c.eos_id))
    if bad.any():
        pos = int(np.argmax(bad))
        i = int(np.searchsorted(offsets, pos, side="right")) - 1
        raise ValueError(f"examples: pair {i}'s {side} holds id {int(flat[pos])}: subword ids must lie in "
                         f"[0, {c.vocab_size}) and not be pad, BOS or EOS ({c.pad_id}, {c.bos_id}, {c.eos_id})")
    return out


def flatten_rows(rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Variable-length rows as (concatenated ids, offsets, lengths), all int64: one array, not one per pair."""
    lengths = np.array([r.size for r in rows], np.int64)
    flat = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    return flat, np.cumsum(lengths) - lengths, lengths


def padded_rows(flat: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, index: np.ndarray, width: int,
                pad_id: int) -> np.ndarray:
    """The rows ``index`` of a flattened ragged array, right-padded with ``pad_id``: (len(index), width) int64."""
    n = lengths[index]                                                       # (B,)
    row = np.repeat(np.arange(index.size), n)                                # (sum n,) row of each token
    col = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)                # (sum n,) column of each token
    out = np.full((index.size, width), pad_id, np.int64)
    out[row, col] = flat[np.repeat(offsets[index], n) + col]
    return out
