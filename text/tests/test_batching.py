"""Batches by token count: every pair in an epoch (once, or with ``fill_last`` a few again to complete a group's last
batch), reproducible from (seed, epoch), resumable by step, shapes on the impls' buckets, the demo's (src, tgt_in,
tgt_out) layout, and errors naming the pair."""

from __future__ import annotations

import numpy as np
import pytest

from spec import shapes
from spec.config import TINY
from text.batching import Batch, TokenBatches
from text.pairs import examples

C = TINY                                     # vocab 61, max_len 64, pad 0, bos 1, eos 2
N, TOKENS = 700, 512


def corpus(n: int = N, seed: int = 0, low: int = 5) -> tuple[list[list[int]], list[list[int]]]:
    """n pairs of ordinary ids: source lengths low..C.max_len - 1, target within 4 of the source's."""
    rng = np.random.default_rng(seed)
    src_len = rng.integers(low, C.max_len, n)
    tgt_len = np.clip(src_len + rng.integers(-4, 5, n), 1, C.max_len - 1)
    draw = lambda k: rng.integers(3, C.vocab_size, k).tolist()  # noqa: E731
    return [draw(k) for k in src_len], [draw(k) for k in tgt_len]


@pytest.fixture(scope="module")
def data():
    return corpus()


@pytest.fixture(scope="module")
def tb(data) -> TokenBatches:
    return TokenBatches(*data, C, TOKENS, seed=3)


def all_batches(t: TokenBatches, epoch: int = 0) -> list[Batch]:
    return [t.batch(epoch * t.batches_per_epoch + k) for k in range(t.batches_per_epoch)]


def test_examples_append_eos_to_the_source_only():
    src, tgt = examples([[5, 6], [7]], [[8], [9, 10, 11]], C)
    assert [a.tolist() for a in src] == [[5, 6, 2], [7, 2]] and [a.tolist() for a in tgt] == [[8], [9, 10, 11]]
    assert all(a.dtype == np.int64 for a in src + tgt)


def test_every_pair_appears_once_per_epoch(data):
    t = TokenBatches(*data, C, TOKENS, seed=3, fill_last=False)
    for e in (0, 1):
        index = np.concatenate(t.epoch(e))
        assert np.array_equal(np.sort(index), np.arange(N)) and len(t.epoch(e)) == t.batches_per_epoch


def test_filled_last_batches_give_each_group_one_shape(data, tb):
    """With ``fill_last`` (the default) every pair is still in an epoch, the repeats only complete a group's last
    batch (never twice in one batch), and a group has one shape: fewer compiles for the same batches per epoch."""
    once = TokenBatches(*data, C, TOKENS, seed=3, fill_last=False)
    assert tb.batches_per_epoch == once.batches_per_epoch
    for e in (0, 1):
        rows, sizes = group_rows(tb, tb.epoch(e)), group_rows(once, once.epoch(e))
        index = np.concatenate(tb.epoch(e))
        assert np.array_equal(np.unique(index), np.arange(N)) and all(np.unique(b).size == b.size for b in tb.epoch(e))
        assert all(len(set(r)) == 1 for r in rows.values()), rows                 # one row count per group
        repeats = sum(-sum(r) % tb.rows(*k) for k, r in sizes.items() if sum(r) > tb.rows(*k))
        assert index.size - N == repeats > 0
    assert len(tb.shape_counts(0)) == len(rows) < len(once.shape_counts(0))


def group_rows(t: TokenBatches, batches: list[np.ndarray]) -> dict[tuple[int, int], list[int]]:
    """(S, T) -> the row counts of that length group's batches."""
    rows: dict[tuple[int, int], list[int]] = {}
    for b in batches:
        a = t.arrays(b)
        rows.setdefault((a.src.shape[1], a.tgt_in.shape[1]), []).append(b.size)
    return rows


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_epochs_are_a_function_of_seed_and_epoch(data, tb):
    again = TokenBatches(*data, C, TOKENS, seed=3)
    assert same(again.epoch(1), tb.epoch(1)) and same(again.epoch(0), tb.epoch(0))
    assert not same(tb.epoch(0), tb.epoch(1))
    assert not same(TokenBatches(*data, C, TOKENS, seed=4).epoch(0), tb.epoch(0))


def test_a_resumed_run_sees_the_same_batches(data, tb):
    steps = range(tb.batches_per_epoch - 3, tb.batches_per_epoch + 3)     # across the epoch boundary
    run = [tb.batch(k) for k in steps]
    for k, b in zip(steps, run, strict=True):
        resumed = TokenBatches(*data, C, TOKENS, seed=3).batch(k)
        for name in ("src", "tgt_in", "tgt_out", "index"):
            assert np.array_equal(getattr(resumed, name), getattr(b, name))
        assert (resumed.tokens, resumed.positions) == (b.tokens, b.positions)


def test_shapes_are_on_the_buckets_and_rows_a_power_of_two(tb, data):
    src, tgt = data
    for b in all_batches(tb):
        (B, S), T = b.src.shape, b.tgt_in.shape[1]
        assert b.tgt_out.shape == (B, T) and b.index.shape == (B,)
        assert S == shapes.length_bucket(max(len(src[i]) + 1 for i in b.index), C.max_len)
        assert T == shapes.length_bucket(max(len(tgt[i]) + 1 for i in b.index), C.max_len)
        assert B <= tb.rows(S, T) and tb.rows(S, T) & (tb.rows(S, T) - 1) == 0
        assert b.positions == shapes.batch_bucket(B) * (S + T)


def test_full_batches_hold_about_tokens_per_batch(tb):
    full = [b for b in all_batches(tb) if len(b.index) == tb.rows(b.src.shape[1], b.tgt_in.shape[1])]
    assert len(full) >= tb.batches_per_epoch // 2
    for b in full:
        assert len(b.index) * max(b.src.shape[1], b.tgt_in.shape[1]) == TOKENS      # power-of-two buckets: exact
        assert TOKENS / 2 <= b.tokens / 2 <= 2 * TOKENS                             # real tokens per side


def test_arrays_follow_the_demo_layout(tb, data):
    src, tgt = data
    for b in all_batches(tb)[:5]:
        assert all(a.dtype == np.int64 for a in (b.src, b.tgt_in, b.tgt_out, b.index))
        for r, i in enumerate(b.index):
            s, t = src[i], tgt[i]
            S, T = b.src.shape[1], b.tgt_in.shape[1]
            assert b.src[r].tolist() == s + [C.eos_id] + [C.pad_id] * (S - len(s) - 1)
            assert b.tgt_in[r].tolist() == [C.bos_id] + t + [C.pad_id] * (T - len(t) - 1)
            assert b.tgt_out[r].tolist() == t + [C.eos_id] + [C.pad_id] * (T - len(t) - 1)
        assert b.tokens == int((b.src != C.pad_id).sum() + (b.tgt_out != C.pad_id).sum())


def test_padding_fraction_matches_a_direct_count(tb):
    batches = all_batches(tb, epoch=1)
    real = sum(int((b.src != C.pad_id).sum() + (b.tgt_out != C.pad_id).sum()) for b in batches)
    computed = sum(shapes.batch_bucket(b.src.shape[0]) * (b.src.shape[1] + b.tgt_in.shape[1]) for b in batches)
    assert tb.padding_fraction(1) == pytest.approx(1 - real / computed, abs=1e-12)
    assert sum(tb.shape_counts(1).values()) == tb.batches_per_epoch


def test_custom_buckets_and_any_row_count(data):
    buckets = [8, 12, 16, 24, 32, 48, 64]
    t = TokenBatches(*data, C, 1000, length_buckets=buckets, pow2_batch=False, fill_last=False)
    assert np.array_equal(np.sort(np.concatenate(t.epoch(0))), np.arange(N))
    for b in all_batches(t):
        (B, S), T = b.src.shape, b.tgt_in.shape[1]
        assert S in buckets and T in buckets and B <= round(1000 / max(S, T))
        assert b.positions == B * (S + T)
    assert t.rows(48, 24) == 21 and TokenBatches(*data, C, 1000, length_buckets=buckets).rows(48, 24) == 16


def test_errors_name_the_pair():
    ok = [5, 6]
    with pytest.raises(ValueError, match="2 source sentences for 1 target sentences"):
        TokenBatches([ok, ok], [ok], C, TOKENS)
    with pytest.raises(ValueError, match="pair 1 has an empty target"):
        TokenBatches([ok, ok], [ok, []], C, TOKENS)
    with pytest.raises(ValueError, match="pair 0 has an empty source"):
        examples([[]], [ok], C)
    with pytest.raises(ValueError, match="pair 1's source has 64 tokens; with its EOS it must fit max_len 64"):
        TokenBatches([ok, [5] * 64], [ok, ok], C, TOKENS)
    with pytest.raises(ValueError, match="pair 2's target has 64 tokens"):
        TokenBatches([ok] * 3, [ok, ok, [5] * 64], C, TOKENS)
    with pytest.raises(ValueError, match="pair 1's target holds id 61"):
        TokenBatches([ok, ok], [ok, [5, 61]], C, TOKENS)
    with pytest.raises(ValueError, match="pair 0's source holds id 2"):
        TokenBatches([[5, C.eos_id]], [ok], C, TOKENS)
    with pytest.raises(ValueError, match="pair 0's source is not a sequence of int ids"):
        examples([[5.0, 6.0]], [ok], C)


def test_errors_in_the_options():
    ok = [[5, 6]]
    with pytest.raises(ValueError, match="no sentence pairs"):
        TokenBatches([], [], C, TOKENS)
    with pytest.raises(ValueError, match="tokens_per_batch must be an int >= 1"):
        TokenBatches(ok, ok, C, 0)
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        TokenBatches(ok, ok, C, TOKENS, seed=-1)
    with pytest.raises(ValueError, match="length_buckets must be strictly increasing"):
        TokenBatches(ok, ok, C, TOKENS, length_buckets=[16, 8])
    with pytest.raises(ValueError, match="length_buckets must be strictly increasing ints in \\[1, max_len=64\\]"):
        TokenBatches(ok, ok, C, TOKENS, length_buckets=[8, 128])
    with pytest.raises(ValueError, match="pair 1 needs 11 source and 3 target positions; the largest length bucket"):
        TokenBatches([[5], [5] * 10], [[5], [5, 6]], C, TOKENS, length_buckets=[4, 8])
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        TokenBatches(ok, ok, C, TOKENS).batch(-1)
