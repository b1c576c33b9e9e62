"""The training demo's task and metric: every impl trains on the same synthetic task from the same weights and data.

The task is to reverse a random sequence of 8 to 16 ordinary tokens (never pad, BOS or EOS)::

    src    = a b c d EOS            (B, S) int64, right-padded with pad_id to the batch's longest
    tgt_in = BOS d c b a            (B, T) int64, T = S
    tgt_out= d c b a EOS            (B, T) int64

Here are the task's model and schedule, its batches (``reverse_batch``), the fixed held-out set (``heldout``) and the
score (``exact_match``, ``evaluate``): greedy decoding of the held-out set, a row counting when the output is the
reversed sequence and EOS, exactly. ``Transformer(config, seed)`` holds ``spec.init_params(config, seed)`` in every
impl and the batches come from one NumPy generator here, so every backend starts from the same bits and sees the same
data. The training run through the common API and its command line are ``tools.train_demo``
(``python -m tools.train_demo --backend torch``); ``spec.data_parallel`` trains on the same task.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from spec.config import TINY, Config
from spec.training import TrainConfig

# The paper's architecture at a small size, a little larger than ``tiny`` (d_model 64 against 32, d_ff 128 against
# 48, d_k = d_v = 16; 2 + 2 layers, V = 61 as tiny). fp32 master weights computing in bf16 (mixed precision,
# spec.training): bf16 weights would lose Adam's small late updates to rounding. Dropout is the paper's 0.1 (section
# 5.4). The measurements behind these choices: docs/decisions.md, "The training demo".
DEMO_CONFIG = TINY.replace(d_model=64, n_heads=4, d_k=16, d_v=16, d_ff=128, param_dtype="float32")
# The paper's Adam, label smoothing and schedule (equation 3); only warmup is shorter: 4000 steps fit 100k steps of
# WMT, while here the learning rate would still be climbing at the end of the run. Warmup 100 peaks at
# d_model^-0.5 * 100^-0.5 = 0.0125 and decays as t^-0.5 to 0.0032 at step 1500 (other warmups: docs/decisions.md).
TRAIN_CONFIG = TrainConfig(warmup_steps=100)
STEPS, BATCH, SEED = 1500, 64, 0  # the demo's defaults: steps of the full run, sequences per batch, seed
MIN_LEN, MAX_LEN = 8, 16
HELDOUT_SEED, HELDOUT_SIZE = 1_000_003, 1000  # a generator of its own, fixed whatever --seed
# The held-out set is decoded by the average of the last 5 checkpoints, as the paper's base models were (section 6.1):
# a single checkpoint's accuracy wanders while the learning rate is still high (docs/decisions.md).
AVERAGE = 5


def ordinary_tokens(config: Config) -> np.ndarray:
    """The ids that are neither pad, BOS nor EOS: (V - 3,) int64."""
    return np.setdiff1d(np.arange(config.vocab_size), [config.pad_id, config.bos_id, config.eos_id])


def reverse_batch(rng: np.random.Generator, config: Config, batch: int, min_len: int = MIN_LEN,
                  max_len: int = MAX_LEN) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A batch of the reverse task: sequences of ``min_len``..``max_len`` ordinary tokens, uniform in length.

    Returns (src, tgt_in, tgt_out), each (B, L + 1) int64 for L the batch's longest sequence: src = seq + EOS,
    tgt_in = BOS + reversed seq, tgt_out = reversed seq + EOS, right-padded with pad_id.

    Raises:
        ValueError: if the lengths are not 1 <= min_len <= max_len < config.max_len, or ``batch`` < 1.
    """
    if not (1 <= min_len <= max_len < config.max_len) or batch < 1:
        raise ValueError(f"reverse_batch: need 1 <= min_len <= max_len < max_len={config.max_len} and batch >= 1, "
                         f"got min_len={min_len}, max_len={max_len}, batch={batch}")
    ordinary = ordinary_tokens(config)
    n = rng.integers(min_len, max_len + 1, size=batch)                          # (B,) lengths
    pos = np.arange(int(n.max()) + 1)                                           # (L + 1,)
    seq = ordinary[rng.integers(0, ordinary.size, size=(batch, max_len + 1))][:, :pos.size]  # (B, L + 1), cut at n
    inside, at_end = pos < n[:, None], pos == n[:, None]                        # (B, L + 1) bool
    after = np.where(at_end, config.eos_id, config.pad_id)                      # (B, L + 1): EOS, then padding
    src = np.where(inside, seq, after)                                          # (B, S) = (B, L + 1)
    rev = np.take_along_axis(seq, np.clip(n[:, None] - 1 - pos, 0, None), axis=1)   # (B, L + 1): seq[n - 1 - i]
    tgt_out = np.where(inside, rev, after)                                      # (B, T) = (B, L + 1)
    tgt_in = np.where(pos == 0, config.bos_id, np.where(pos <= n[:, None], np.roll(rev, 1, axis=1),
                                                         config.pad_id))        # (B, T): BOS, then rev shifted
    return src.astype(np.int64), tgt_in.astype(np.int64), tgt_out.astype(np.int64)


def lm_reverse_batch(rng: np.random.Generator, config: Config, batch: int, min_len: int = MIN_LEN,
                     max_len: int = MAX_LEN) -> np.ndarray:
    """The reverse task for a decoder-only model: tokens (B, 2 L + 3) int64, each row BOS, the sequence, EOS, the
    reversed sequence, EOS, right-padded with pad_id; the prompt is the row up to its first EOS (``reverse_batch``'s
    sequences and raises)."""
    src, _, tgt_out = reverse_batch(rng, config, batch, min_len, max_len)
    n = (src != config.pad_id).sum(axis=1)                                      # sequence + EOS
    tokens = np.full((batch, 1 + 2 * src.shape[1]), config.pad_id, np.int64)
    tokens[:, 0] = config.bos_id
    for b, k in enumerate(n):
        tokens[b, 1:1 + 2 * k] = np.concatenate([src[b, :k], tgt_out[b, :k]])
    return tokens


def heldout(config: Config, size: int = HELDOUT_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """The fixed held-out set: (src (N, S), expected (N, T) = reversed seq + EOS, padded) int64, N = ``size``.

    Drawn from its own generator (``HELDOUT_SEED``). Of the 58^8 or more possible sequences a training run sees
    ~10^5, so an overlap with training data is vanishingly unlikely (and would not be memorised anyway).
    """
    src, _, tgt_out = reverse_batch(np.random.default_rng(HELDOUT_SEED), config, size)
    return src, tgt_out


def exact_match(tokens: Any, expected: np.ndarray, pad_id: int = 0) -> float:
    """The fraction of rows whose greedy output equals ``expected`` exactly (EOS included, then only padding).

    tokens (N, L) int (search output, right-padded with ``pad_id``; any framework's array on the host), expected
    (N, T) int. Search never generates pad, so padded rows are equal exactly when the outputs are.

    Raises:
        ValueError: if the row counts differ.
    """
    got, want = _host(tokens).astype(np.int64), np.asarray(expected, np.int64)
    if got.shape[0] != want.shape[0]:
        raise ValueError(f"exact_match: {got.shape[0]} output rows for {want.shape[0]} expected")
    width = max(got.shape[1], want.shape[1])
    got, want = (np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=pad_id) for a in (got, want))
    return float((got == want).all(axis=1).mean())


def evaluate(T: ModuleType, model: Any, config: Config, data: tuple[np.ndarray, np.ndarray]) -> float:
    """Greedy exact match of ``model`` on ``data`` = (src, expected); at most the longest expected row generated."""
    src, expected = data
    return exact_match(T.greedy_search(model, src, max_new_tokens=expected.shape[1]), expected, config.pad_id)


# ----------------------------------------------------------------- internals

def _host(x: Any) -> np.ndarray:
    """A framework array (torch on any device, JAX, TensorFlow) or NumPy array as NumPy."""
    if hasattr(x, "detach"):  # torch (TensorFlow's tensors have a deprecated .cpu, no .detach): CUDA has no NumPy view
        x = x.detach().cpu()
    return np.asarray(x)
