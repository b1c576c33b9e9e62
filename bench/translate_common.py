"""What the translation workload shares across frameworks and processes: the model, the sentences, the batches.

Framework-neutral (NumPy only). ``bench.translate_run`` drives it; ``bench.translate_worker`` runs one system in a
process of its own (its peak memory is that process's).

The model is ``--config`` with LayerNorm epsilon 1e-5 (Marian's fixed value) and heads d_model / n_heads wide
(``translate_config``), so that the peers compute the spec's function from the same canonical weights
(``spec.convert.marian``); for ``base`` the cost is the preset's. The weights are ``bench.common.bench_params``:
the EOS logit is exactly 0 and never the largest, so every system decodes ``NEW_TOKENS`` tokens for every
sentence, the same work everywhere.
"""

from __future__ import annotations

import numpy as np

import spec
from spec.config import Config

NEW_TOKENS = 40     # tokens each sentence is translated into (no hypothesis ends earlier: ``bench_params``)
LENGTHS = (10, 40)  # source tokens per sentence, EOS included: uniform in this range
BEAM_SIZE = 4
ALPHA = 0.6


def translate_config(preset: str, dtype: str) -> Config:
    """The preset in ``dtype`` (weights too), without dropout, with Marian's LayerNorm epsilon and heads d_model /
    n_heads wide (as in ``base``; the peers know no other width)."""
    c = spec.preset(preset)
    return c.replace(dtype=dtype, param_dtype=dtype, dropout=0.0, layer_norm_eps=1e-5, d_k=c.d_model // c.n_heads,
                     d_v=c.d_model // c.n_heads)


def sentence_count(batch: int) -> int:
    """How many sentences a workload of batch ``batch`` translates: 8 one at a time, else 64 (at least one batch)."""
    return 8 if batch == 1 else max(batch, 64)


def sentences(config: Config, n: int, seed: int = 0) -> list[np.ndarray]:
    """n source sentences: ordinary tokens, then EOS; lengths uniform in ``LENGTHS``."""
    rng = np.random.default_rng(seed)
    low = 1 + max(config.pad_id, config.bos_id, config.eos_id)
    lengths = rng.integers(LENGTHS[0], LENGTHS[1] + 1, n)
    return [np.append(rng.integers(low, config.vocab_size, k - 1), config.eos_id) for k in lengths]


def batches(config: Config, rows: list[np.ndarray], batch: int) -> list[np.ndarray]:
    """The sentences in order, ``batch`` at a time, each batch (B, S) right-padded with ``pad_id`` to its longest."""
    out = []
    for i in range(0, len(rows), batch):
        group = rows[i:i + batch]
        src = np.full((len(group), max(map(len, group))), config.pad_id, np.int64)
        for r, row in enumerate(group):
            src[r, :len(row)] = row
        out.append(src)
    return out


def unpad(config: Config, tokens: np.ndarray) -> list[list[int]]:
    """Search output (B, L) -> each row's tokens before the first pad or EOS (the translations, compared across
    systems)."""
    rows = []
    for row in np.asarray(tokens).tolist():
        end = next((i for i, t in enumerate(row) if t in (config.pad_id, config.eos_id)), len(row))
        rows.append(row[:end])
    return rows
