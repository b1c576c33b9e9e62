"""Layers alone, eagerly: the contract's rounding points, masks, the positional table, and dropout (compiled as the
model's forward is, and eagerly)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import impl_tf
from impl_tf.layers import dropout
from impl_tf.numerics import linear
from spec import reference as ref
from spec.numerics import Numerics
from spec.recording import record, recording, scope

BF16 = ml_dtypes.bfloat16


@pytest.mark.parametrize("halves", [False, True], ids=["interleaved", "halves"])
def test_positional_encoding_is_the_exact_table_rounded_to_fp32(halves):
    pe = impl_tf.layers.positional_encoding(50, 32, halves).numpy()
    assert pe.dtype == np.float32
    np.testing.assert_array_equal(pe, ref.positional_encoding(50, 32, halves).astype(np.float32))


@pytest.mark.parametrize("name", ["relu", "gelu", "gelu_tanh", "silu"])
def test_activation_is_the_exact_one_rounded_once(name):
    """bf16 hidden units: ReLU exactly; the others in fp32, rounded once: within one bf16 ulp of the float64 value
    rounded to bf16, up to an absolute 1e-6 (where the value is tiny, as fp32's tanh saturates)."""
    h = np.random.default_rng(0).normal(0.0, 3.0, 4096).astype(BF16)
    got = impl_tf.layers.activation(tf.constant(h), name).numpy()
    want = ref.layers.activation(h.astype(np.float64), name, Numerics("bfloat16")).astype(BF16)
    assert got.dtype == BF16
    err, ulp = np.abs(got.astype(np.float64) - want), np.spacing(np.abs(want).astype(np.float32)) * 2.0**16
    assert err.max() == 0.0 if name == "relu" else (err <= np.maximum(ulp, 1e-6)).all()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "xla"])
def test_product_rounds_once_after_the_bias(compiled):
    """bf16 operands, fp32 accumulation, one rounding: the float64 result rounded via fp32, eagerly and in XLA."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 9, 256)).astype(BF16)
    w = rng.standard_normal((256, 40)).astype(BF16)
    b = rng.standard_normal(40).astype(BF16)
    product = lambda x, w, b: linear(x, w, b)  # noqa: E731
    got = (tf.function(product, jit_compile=True) if compiled else product)(*map(tf.constant, (x, w, b))).numpy()
    exact = x.astype(np.float64) @ w.astype(np.float64) + b.astype(np.float64)
    ideal = exact.astype(np.float32).astype(BF16)
    assert got.dtype == BF16
    # fp32 summation order may move a value lying within ~2^-16 ulp of a bf16 rounding boundary.
    assert np.mean(got != ideal) < 1e-3
    assert np.abs(got.astype(np.float64) - exact).max() <= np.abs(ideal.astype(np.float64) - exact).max() * 1.01


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), T=st.integers(1, 5), S=st.integers(1, 7))
def test_masked_keys_get_zero_weight(seed, T, S):
    """Changing the values of masked keys changes nothing; a fully masked query row stays finite."""
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((2, n, 3, 4)).astype(BF16) for n in (T, S))
    v = rng.standard_normal((2, S, 3, 5)).astype(BF16)
    mask = rng.random((2, 1, T, S)) < 0.6
    mask[1, 0, 0] = False  # one fully masked row
    v2 = np.where(mask.any(axis=(1, 2))[:, :, None, None], v, v + BF16(3.0)).astype(BF16)
    heads_major = lambda x: np.transpose(x, (0, 2, 1, 3))  # noqa: E731  (B, H, S, K) as the KV cache holds them
    a = impl_tf.layers.scaled_dot_product_attention(q, heads_major(k), heads_major(v), mask).numpy()
    b = impl_tf.layers.scaled_dot_product_attention(q, heads_major(k), heads_major(v2), mask).numpy()
    assert a.shape == (2, T, 3, 5) and a.dtype == BF16
    assert np.isfinite(a.astype(np.float32)).all()
    rows = mask[:, 0].any(axis=-1)  # (B, T): queries with at least one key
    np.testing.assert_array_equal(a[rows], b[rows])


def test_layer_norm_statistics_in_fp32(model):
    """LayerNorm of a bf16 input whose mean dwarfs its spread: fp32 statistics keep the spread."""
    norm = model.encoder.layers[0].ffn_norm
    x = (256.0 + np.arange(32) % 4).astype(BF16)[None, None]
    got = norm.forward(tf.constant(x)).numpy().astype(np.float64)
    p = {f"n.{k}": v.numpy().astype(np.float64) for k, v in (("scale", norm.scale), ("bias", norm.bias))}
    want = ref.layer_norm(p, "n", x.astype(np.float64), norm.eps, Numerics("bfloat16"))
    np.testing.assert_array_equal(got, want)


def test_record_collects_only_while_recording(model):
    """Outside ``recording``, ``record`` returns its tensor and stores it nowhere; inside, a layer run eagerly
    records under the names its ``scope`` completes."""
    x = tf.constant(np.ones((1, 3, model.config.d_model), BF16))
    with recording() as rec:
        pass
    assert record("out", x) is x
    assert rec == {}
    mask = tf.ones((1, 1, 1, 3), tf.bool)
    with recording() as rec, scope("encoder.layers.0"):
        model.encoder.layers[0].forward(x, mask)
    assert sorted(rec) == [f"encoder.layers.0.{s}" for s in ("ffn", "ffn.residual", "self_attn", "self_attn.residual")]


def test_numerics_scope_turns_tf32_off_and_restores_it():
    before = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(True)
    try:
        with impl_tf.numerics_scope():
            assert not tf.config.experimental.tensor_float_32_execution_enabled()
        assert tf.config.experimental.tensor_float_32_execution_enabled()
        with pytest.raises(RuntimeError, match="inside"), impl_tf.numerics_scope():
            raise RuntimeError("inside")
        assert tf.config.experimental.tensor_float_32_execution_enabled()  # restored on an exception too
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(before)


@pytest.mark.parametrize("rate, dtype", [(0.1, tf.float32), (0.3, tf.bfloat16), (0.5, tf.float32)])
def test_dropout_statistics(rate, dtype):
    """The kept fraction is 1 - rate within 5 standard deviations; kept values are the fp32 quotient x / (1 - rate)
    rounded once, compiled as the model's forward is (where a scalar divisor becomes a reciprocal product)."""
    x = tf.cast(tf.random.stateless_normal([256, 512], seed=[3, 4]), dtype)      # (256, 512), 131072 elements
    # The seed is an argument, as in the model's programs (a constant seed would fold mask and divisor to constants).
    y = tf.function(lambda x, seed: dropout(x, "ffn", rate, seed), jit_compile=True)(x, tf.constant([7, 0], tf.int64))
    y = y.numpy()
    kept = (y != 0) | (x.numpy() == 0)
    sigma = np.sqrt(rate * (1 - rate) / kept.size)
    print(f"rate {rate}: kept {kept.mean():.5f}, expected {1 - rate} +- {sigma:.2g}")
    assert abs(kept.mean() - (1 - rate)) < 5 * sigma
    want = (x.numpy().astype(np.float32) / np.float32(1 - rate)).astype(y.dtype)
    np.testing.assert_array_equal(y[kept], want[kept])


def test_dropout_sites_and_seeds():
    """Each site (its scoped name) draws its own mask; the same seed gives the same masks; rate 0 and no seed are
    the identity; the keep mask and the result are recorded under the site."""
    x, seed = tf.ones([64, 64]), tf.constant([1, 2], tf.int64)
    first = dropout(x, "ffn", 0.5, seed).numpy()
    np.testing.assert_array_equal(first, dropout(x, "ffn", 0.5, tf.constant([1, 2], tf.int64)).numpy())
    assert not np.array_equal(first, dropout(x, "self_attn", 0.5, seed).numpy())
    with scope("encoder.layers.1"):
        assert not np.array_equal(first, dropout(x, "ffn", 0.5, seed).numpy())
    assert not np.array_equal(first, dropout(x, "ffn", 0.5, tf.constant([1, 3], tf.int64)).numpy())
    assert dropout(x, "ffn", 0.0, seed) is x and dropout(x, "ffn", 0.5, None) is x
    with recording() as rec:
        y = dropout(x, "ffn", 0.5, seed)
    assert sorted(rec) == ["ffn", "ffn.keep"] and rec["ffn"] is y and rec["ffn.keep"].dtype == tf.bool
    np.testing.assert_array_equal(rec["ffn.keep"].numpy(), first != 0)
