"""Batches by token count (Vaswani et al., 2017, section 5.1: "Sentence pairs were batched together by approximate
sequence length. Each training batch contained a set of sentence pairs containing approximately 25000 source
tokens and 25000 target tokens"), shuffled per epoch from a seed, reproducible and resumable by step.

Pairs are grouped by (source length bucket, target length bucket), a bucket being the smallest of
``length_buckets`` that holds the length (default: the impls' buckets, ``spec.shapes.length_bucket``: 8, 16, 32,
... up to max_len). Each epoch, every group is shuffled by the epoch's generator and cut into batches of B rows,
B * max(S, T) about ``tokens_per_batch`` (with ``pow2_batch`` B is a power of two, which impl_jax and impl_tf pad
B to anyway), and then all batches are shuffled. A batch's arrays have exactly its bucket's lengths, so a backend
that pads to shape buckets adds no padding of its own and compiles once per distinct shape. With ``fill_last``
(the default) a group's last batch, short of B rows, is completed with the first pairs of the group's shuffled
order, which its first batch holds too, so every batch of a group of at least B pairs has one shape: one compile
per group, not two (``shape_counts``). A group of fewer than B pairs is one batch of its own rows (the API refuses
all-pad rows); the rows a bucketing backend adds to reach a power of two are counted in its ``positions``.

Layout per pair (``text.pairs``), as ``spec.demo``: src = ids + EOS, tgt_in = BOS + ids, tgt_out = ids + EOS,
right-padded with pad_id, int64.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

import numpy as np

from spec import shapes, validate
from spec.config import Config
from text.pairs import examples, flatten_rows, padded_rows


@dataclasses.dataclass(frozen=True)
class Batch:
    """One training step's arrays.

    src (B, S), tgt_in (B, T), tgt_out (B, T) int64, S and T the batch's length buckets; index (B,) int64: the
    pairs in the rows, in row order. ``tokens``: real (non-pad) source + target tokens (src and tgt_out).
    ``positions``: (S + T) times the rows a backend computes: B, or with ``pow2_batch`` the power of two that a
    bucketing backend pads B to.
    """

    src: np.ndarray
    tgt_in: np.ndarray
    tgt_out: np.ndarray
    index: np.ndarray
    tokens: int
    positions: int


def default_buckets(max_len: int) -> list[int]:
    """The impls' length buckets (``spec.shapes.length_bucket``): 8, 16, 32, ... capped at ``max_len``."""
    return sorted({shapes.length_bucket(n, max_len) for n in range(1, max_len + 1)})


class TokenBatches:
    """The batches of a tokenised parallel corpus (see the module docstring).

    ``batches_per_epoch`` is the same for every epoch (the groups' sizes do not change); ``buckets`` is the sorted
    tuple of length buckets.

    Raises:
        ValueError: from the constructor: anything ``examples`` refuses; ``tokens_per_batch`` or ``seed`` not a
            non-negative int (``tokens_per_batch`` >= 1); ``length_buckets`` not increasing positive ints up to
            ``config.max_len``, or with none holding a pair (naming it).
    """

    def __init__(self, src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]], config: Config,
                 tokens_per_batch: int, *, seed: int = 0, length_buckets: Sequence[int] | None = None,
                 pow2_batch: bool = True, fill_last: bool = True):
        if not validate.is_int(tokens_per_batch) or tokens_per_batch < 1:
            raise ValueError(f"TokenBatches: tokens_per_batch must be an int >= 1, got {tokens_per_batch!r}")
        if not validate.is_int(seed) or seed < 0:
            raise ValueError(f"TokenBatches: seed must be an int >= 0, got {seed!r}")
        src, tgt = examples(src_ids, tgt_ids, config)
        if not src:
            raise ValueError("TokenBatches: no sentence pairs")
        self.config, self.tokens_per_batch, self.seed, self.pow2_batch = config, tokens_per_batch, seed, pow2_batch
        self.fill_last = fill_last
        self.buckets = _check_buckets(length_buckets, config.max_len)
        self._src, self._tgt = flatten_rows(src), flatten_rows(tgt)
        src_len, tgt_len = self._src[2], self._tgt[2] + 1            # positions: ids + EOS; BOS/EOS + ids
        self._tokens = src_len + tgt_len                             # (N,) real tokens per pair
        self._groups = self._group(src_len, tgt_len)
        self.batches_per_epoch = sum(-(-idx.size // self.rows(S, T)) for (S, T), idx in self._groups.items())
        self._cached: tuple[int, list[np.ndarray]] | None = None

    def rows(self, S: int, T: int) -> int:
        """Rows of a full batch at length buckets (S, T): tokens_per_batch / max(S, T), rounded to the nearest
        power of two in log scale with ``pow2_batch`` (so within a factor sqrt(2)), else to the nearest int; >= 1."""
        rows = self.tokens_per_batch / max(S, T)
        if not self.pow2_batch:
            return max(1, round(rows))
        return 1 << max(0, int(round(np.log2(rows))))

    def epoch(self, e: int) -> list[np.ndarray]:
        """The batches of epoch ``e``, each an int64 array of pair indices: a function of (seed, e) only. Every pair
        is in one batch; with ``fill_last``, a few also in the last batch of their group.

        Raises:
            ValueError: if ``e`` is not an int >= 0.
        """
        if not validate.is_int(e) or e < 0:
            raise ValueError(f"TokenBatches.epoch: the epoch must be an int >= 0, got {e!r}")
        if self._cached is None or self._cached[0] != e:
            rng = np.random.default_rng((self.seed, e))              # its own generator: no global state
            batches = []
            for (S, T), idx in self._groups.items():                 # sorted keys: the same draws every time
                idx, B = rng.permutation(idx), self.rows(S, T)
                if self.fill_last and idx.size > B and idx.size % B:                # the first pairs again
                    idx = np.concatenate([idx, idx[:B - idx.size % B]])
                batches += [idx[k:k + B] for k in range(0, idx.size, B)]
            for b in batches:
                b.flags.writeable = False                            # shared with the cache and every Batch
            self._cached = e, [batches[i] for i in rng.permutation(len(batches))]   # one epoch kept
        return list(self._cached[1])

    def batch(self, step: int) -> Batch:
        """The batch of training step ``step`` (0, 1, ...: through epoch 0, then 1, ...); the same whenever asked,
        so a run resumed at step k sees what the uninterrupted run saw.

        Raises:
            ValueError: if ``step`` is not an int >= 0.
        """
        if not validate.is_int(step) or step < 0:
            raise ValueError(f"TokenBatches.batch: step must be an int >= 0, got {step!r}")
        e, k = divmod(step, self.batches_per_epoch)
        return self.arrays(self.epoch(e)[k])

    def arrays(self, index: np.ndarray) -> Batch:
        """The padded arrays of the pairs ``index`` (one group's), at the group's length buckets."""
        c, index = self.config, np.asarray(index, np.int64)
        S, T = self._key(index)
        body = padded_rows(*self._tgt, index, T, c.pad_id)                       # (B, T): ids, then pad
        n = self._tgt[2][index][:, None]                                         # (B, 1) target lengths
        col = np.arange(T)
        tgt_out = np.where(col == n, c.eos_id, body)                             # ids + EOS
        tgt_in = np.where(col == 0, c.bos_id, np.where(col <= n, np.roll(body, 1, axis=1), c.pad_id))  # BOS + ids
        return Batch(padded_rows(*self._src, index, S, c.pad_id), tgt_in, tgt_out, index,
                     int(self._tokens[index].sum()), self._computed_rows(index.size) * (S + T))

    def padding_fraction(self, epoch: int = 0) -> float:
        """1 - real tokens / computed positions over the batches of ``epoch``, without building their arrays."""
        real = positions = 0
        for index in self.epoch(epoch):
            S, T = self._key(index)
            real += int(self._tokens[index].sum())
            positions += self._computed_rows(index.size) * (S + T)
        return 1.0 - real / positions

    def shape_counts(self, epoch: int = 0) -> collections.Counter[tuple[int, int, int]]:
        """(rows computed, S, T) -> number of batches in ``epoch``: each distinct shape is one compilation for a
        backend that compiles per shape."""
        return collections.Counter((self._computed_rows(ix.size), *self._key(ix)) for ix in self.epoch(epoch))

    # ------------------------------------------------------------------ internals

    def _bucket(self, lengths: np.ndarray) -> np.ndarray:
        return np.asarray(self.buckets)[np.searchsorted(self.buckets, lengths)]

    def _key(self, index: np.ndarray) -> tuple[int, int]:
        """(S, T): the length buckets of the pairs ``index``."""
        S = self._bucket(self._src[2][index].max())
        T = self._bucket(self._tgt[2][index].max() + 1)
        return int(S), int(T)

    def _computed_rows(self, n: int) -> int:
        return shapes.batch_bucket(n) if self.pow2_batch else n

    def _group(self, src_len: np.ndarray, tgt_len: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
        """(S bucket, T bucket) -> the pair indices in it (ascending), keys sorted.

        Raises:
            ValueError: naming the first pair longer than the largest bucket.
        """
        too_long = np.flatnonzero(np.maximum(src_len, tgt_len) > self.buckets[-1])
        if too_long.size:
            i = int(too_long[0])
            raise ValueError(f"TokenBatches: pair {i} needs {src_len[i]} source and {tgt_len[i]} target positions; "
                             f"the largest length bucket is {self.buckets[-1]}")
        S, T = self._bucket(src_len), self._bucket(tgt_len)
        order = np.lexsort((np.arange(S.size), T, S))                # by S, then T, then index
        keys, starts = np.unique(np.stack([S[order], T[order]], 1), axis=0, return_index=True)
        parts = np.split(order, starts[1:])
        return {(int(s), int(t)): part for (s, t), part in zip(keys, parts, strict=True)}


def _check_buckets(buckets: Sequence[int] | None, max_len: int) -> tuple[int, ...]:
    """The sorted length buckets: ``default_buckets(max_len)`` when None.

    Raises:
        ValueError: if they are not strictly increasing positive ints up to ``max_len``.
    """
    if buckets is None:
        return tuple(default_buckets(max_len))
    b = tuple(buckets)
    if not b or not all(validate.is_int(x) and 1 <= x <= max_len for x in b) or list(b) != sorted(set(b)):
        raise ValueError(f"TokenBatches: length_buckets must be strictly increasing ints in [1, max_len={max_len}], "
                         f"got {list(b)}")
    return b
