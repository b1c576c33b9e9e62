"""Dropout (section 5.4) in impl_jax: the mask's statistics and exact scale, its sites, evaluation without it, and
the masks drawn from the train state's key alone."""

from __future__ import annotations

import zlib

import jax
import numpy as np
import pytest

import impl_jax as T
import spec
from impl_jax import layers, numerics
from spec import shapes
from spec.numerics import np_dtype
from spec.recording import recording
from spec.training import TrainConfig

DROP = spec.preset("tiny", dtype="float32", param_dtype="float32").replace(dropout=0.1)
SRC = np.array([[5, 9, 17, 2, 0, 0], [7, 8, 9, 10, 11, 2]])           # (B, S), row 0 padded
TGT_IN = np.array([[1, 4, 5, 6, 0], [1, 7, 8, 9, 10]])                # (B, T)
# The copy task: 4 sequences, the target is the source.
COPY = np.array([[5, 9, 17, 23, 2], [7, 8, 31, 10, 2], [40, 12, 6, 3, 2], [19, 19, 44, 51, 2]])  # (4, 5)
COPY_IN = np.concatenate([np.full((4, 1), 1), COPY[:, :-1]], axis=1)                            # BOS + src
TC = TrainConfig(warmup_steps=20)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dropout_keeps_one_minus_rate_and_divides_exactly(dtype):
    """layers.dropout, jitted as the model runs it: kept fraction 1 - rate within 5 standard deviations, each kept
    value the fp32 quotient x / fp32(1 - rate) rounded once to x's dtype (not x times a rounded reciprocal), the
    keep mask recorded as "<site>.keep" and the result as "<site>"; the identity without a key. Measured: 0.90048
    kept of 100,000 (sd 0.00095)."""
    x = np.random.default_rng(0).standard_normal((200, 500)).astype(np.float32).astype(np_dtype(dtype))

    def drop(x, key):
        with recording() as rec:
            return layers.dropout(x, "ffn", 0.1, key), rec

    y, rec = numerics.jit(drop)(x, jax.random.key(0))
    keep = np.asarray(rec["ffn.keep"])
    assert keep.dtype == bool and keep.shape == x.shape
    assert abs(keep.mean() - 0.9) < 5 * np.sqrt(0.9 * 0.1 / keep.size)
    want = np.where(keep, x.astype(np.float32) / np.float32(0.9), 0).astype(np_dtype(dtype))
    assert y.dtype == want.dtype and np.array_equal(np.asarray(y), want)
    assert np.array_equal(np.asarray(rec["ffn"]), want)
    with recording() as rec:
        assert layers.dropout(x, "ffn", 0.1, None) is x and layers.dropout(x, "ffn", 0.0, jax.random.key(0)) is x
    assert list(rec) == ["ffn"] and rec["ffn"] is x


def test_training_drops_out_every_sublayer_and_both_embeddings():
    """The training forward (with a key) records a keep mask at every dropout site (``spec.shapes.dropout_sites``)
    and nowhere else, bool, the real (B, L, D) and different at each site, about ``rate`` of it dropped; each
    site's recorded value (the one after dropout) is zero where its mask drops. Without a key: no mask, and
    nothing zeroed. Measured fractions 0.072-0.120 per tensor of 320-384 elements, 0.095 pooled."""
    m = T.Transformer(DROP, seed=0)
    (_, train), (_, evaluation) = (m(SRC, TGT_IN, intermediates=True, rng=key) for key in (jax.random.key(3), None))
    sites, want = shapes.dropout_sites(DROP), shapes.intermediates(DROP, 2, 6, 5, dropout=True)   # SRC, TGT_IN
    assert len(sites) == 2 + 2 * 2 + 2 * 3
    assert sorted(k for k in train if k.endswith(".keep")) == sorted(f"{s}.keep" for s in sites)
    masks = {s: np.asarray(train[f"{s}.keep"]) for s in sites}
    assert all(k.dtype == bool and k.shape == want[f"{s}.keep"][0] for s, k in masks.items())
    assert all(not np.asarray(train[s])[~k].any() for s, k in masks.items())
    assert len({k.tobytes() for k in masks.values()}) == len(sites)
    n = min(k.size for k in masks.values())
    assert all(abs((~k).mean() - 0.1) < 5 * np.sqrt(0.1 * 0.9 / n) for k in masks.values())
    assert not [k for k in evaluation if k.endswith(".keep")]
    assert all((np.asarray(evaluation[s]) == 0).mean() < 0.01 for s in sites)


def test_every_site_draws_from_the_one_key_folded_with_its_name():
    """The forward's one key reaches every site unchanged and each site folds its scoped name into it (crc32, as
    impl_tf folds it into its seed): two sites of one shape (two encoder layers' self-attention) draw different
    masks, the same key draws the same masks again, and each mask is the one its name's key draws at the padded
    (bucketed) shape."""
    m, key = T.Transformer(DROP, seed=0), jax.random.key(3)
    (_, first), (_, again) = (m(SRC, TGT_IN, intermediates=True, rng=key) for _ in range(2))
    a, b = (np.asarray(first[f"encoder.layers.{i}.self_attn.keep"]) for i in (0, 1))
    assert a.shape == b.shape and not np.array_equal(a, b)
    B = SRC.shape[0]
    for site in shapes.dropout_sites(DROP):
        keep = np.asarray(first[f"{site}.keep"])
        assert np.array_equal(keep, np.asarray(again[f"{site}.keep"])), site
        L = (SRC if site == "src_embed" or site.startswith("encoder.") else TGT_IN).shape[1]
        padded = (shapes.batch_bucket(B), shapes.length_bucket(L, DROP.max_len), DROP.d_model)
        drawn = jax.random.bernoulli(jax.random.fold_in(key, zlib.crc32(site.encode())), 1.0 - DROP.dropout, padded)
        assert np.array_equal(keep, np.asarray(drawn)[:B, :L]), site


def _same(a: T.Transformer, b: T.Transformer) -> bool:
    pa, pb = T.params_of(a), T.params_of(b)
    return all(pa[k].tobytes() == pb[k].tobytes() for k in pa)


def test_dropout_masks_come_from_the_state():
    """Equal states give equal steps (no global RNG); another seed other masks; the inputs stay unchanged."""
    m = T.Transformer(DROP, seed=0)
    before = T.params_of(m)
    runs = [T.train_step(m, T.init_train_state(m, TC, seed=s), COPY, COPY_IN, COPY) for s in (0, 0, 1)]
    assert float(runs[0][0]) == float(runs[1][0]) and _same(runs[0][1], runs[1][1])
    assert float(runs[0][0]) != float(runs[2][0]) and not _same(runs[0][1], runs[2][1])
    assert all(before[k].tobytes() == v.tobytes() for k, v in T.params_of(m).items())
    assert not np.array_equal(jax.random.key_data(runs[0][2].rng), jax.random.key_data(jax.random.key(0)))
