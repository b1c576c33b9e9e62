"""Layers alone: the positional table, attention and masks, against the spec where it helps; layers as pytrees."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from impl_jax import layers, numerics
from spec import TINY
from spec import reference as ref
from spec.numerics import Numerics


def test_positional_encoding_is_the_papers_interleaved_table():
    pe = np.asarray(layers.positional_encoding(50, 16))
    assert pe.dtype == np.float32 and pe.shape == (50, 16)
    np.testing.assert_allclose(pe, ref.positional_encoding(50, 16), atol=1e-7)
    np.testing.assert_array_equal(pe[0, 0::2], 0.0)  # sin(0) on even, cos(0) on odd features
    np.testing.assert_array_equal(pe[0, 1::2], 1.0)


def test_positional_encoding_halves_puts_the_sines_first():
    pe = np.asarray(layers.positional_encoding(50, 16, halves=True))
    np.testing.assert_allclose(pe, ref.positional_encoding(50, 16, True), atol=1e-7)
    np.testing.assert_array_equal(pe[:, :8], np.asarray(layers.positional_encoding(50, 16))[:, 0::2])


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "silu"])
def test_activation_is_computed_in_fp32_and_rounded_once(name):
    """Against the float64 reference on [-5, 5] (where its 1 + erf and 1 + tanh keep the bits that matter): fp32
    within 4 ulps times 1 + x^2, the condition number of the GELUs' tails (measured 1.8 ulps for SiLU, 25 for
    the GELUs at x = -5); bf16 its rounding bit for bit (measured: all 4,000; a tie met by fp32's error may flip)."""
    h = np.random.default_rng(0).uniform(-5, 5, 4000)
    for dtype, np_dt in (("float32", np.float32), ("bfloat16", ml_dtypes.bfloat16)):
        x = h.astype(np_dt)
        got = np.asarray(numerics.jit(layers.activation, static_argnums=1)(jnp.asarray(x), name))
        want = ref.layers.activation(x.astype(np.float64), name, Numerics(dtype))
        assert got.dtype == np_dt
        if dtype == "float32":
            ulps = np.abs(got - want) / np.spacing(np.abs(want).astype(np.float32))
            assert (ulps <= 4 * (1 + x.astype(np.float64) ** 2)).all(), ulps.max()
        else:
            assert (got.astype(np.float64) != want).mean() < 1e-3


def _qkv(dtype, B=2, T=5, S=7, H=3, K=8, C=8, seed=0):
    """q (B, T, H, K), heads-major k (B, H, S, K) and v (B, H, S, C), a mask (B, 1, T, S)."""
    rng = np.random.default_rng(seed)
    cast = (lambda x: x.astype(ml_dtypes.bfloat16)) if dtype == "bfloat16" else (lambda x: x.astype(np.float32))
    q, k, v = (cast(rng.standard_normal(s)) for s in ((B, T, H, K), (B, H, S, K), (B, H, S, C)))
    mask = np.ones((B, 1, T, S), bool)
    mask[0, :, :, 4:] = False      # key padding on row 0
    mask[1, :, 2, :] = False       # a fully masked (padding) query row
    return q, k, v, mask


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_attention_agrees_with_the_contract(dtype):
    q, k, v, mask = _qkv(dtype)
    nx = Numerics(dtype)
    exact = ref.scaled_dot_product_attention(*(x.astype(np.float64) for x in (q, k.swapaxes(1, 2), v.swapaxes(1, 2))),
                                             mask, nx)
    out = np.asarray(layers.scaled_dot_product_attention(q, k, v, mask)).astype(np.float64)
    assert np.isfinite(out).all()
    valid = mask.any(axis=-1)[:, 0]                   # (B, T): query rows with a key
    ulp = 2.0**-7 if dtype == "bfloat16" else 2.0**-22
    np.testing.assert_allclose(out[valid], exact[valid], atol=2 * ulp, rtol=2 * ulp)


def test_attention_with_d_v_other_than_d_k():
    q, k, v, mask = _qkv("bfloat16", C=4)
    out = layers.scaled_dot_product_attention(q, k, v, mask)
    assert out.shape == (2, 5, 3, 4) and out.dtype == jnp.bfloat16


def test_masked_keys_get_zero_weight():
    q, k, v, mask = _qkv("bfloat16")
    v2 = v.copy()
    v2[0, :, 4:] = ml_dtypes.bfloat16(1e4)                # values at masked keys of row 0
    a = np.asarray(layers.scaled_dot_product_attention(q, k, v, mask))
    b = np.asarray(layers.scaled_dot_product_attention(q, k, v2, mask))
    np.testing.assert_array_equal(a[0], b[0])


def test_scores_stay_fp32():
    """Scores 1/2 bf16 ulp apart must still order the softmax (rounded to bf16 they would tie)."""
    bf = ml_dtypes.bfloat16
    q = np.array([[[[64.0, 1.0, 0, 0]]]], bf)                            # (1, 1, 1, 4)
    k = np.array([[[[2.0, 0, 0, 0], [2.0, 0.5, 0, 0]]]], bf)              # (1, 1, 2, 4)
    v = np.array([[[[1.0, 0, 0, 0], [0.0, 0, 0, 0]]]], bf)
    mask = np.ones((1, 1, 1, 2), bool)
    out = np.asarray(layers.scaled_dot_product_attention(q, k, v, mask)).astype(np.float64)
    # scores 128 and 128.5 (bf16 would make both 128), scaled to 64 and 64.25:
    # weight of key 0 = 1 / (1 + e^0.25) = 0.4378, rounded to bf16 0.4375; tied scores would give 0.5
    assert out[0, 0, 0, 0] == 0.4375


def test_layer_norm_statistics_in_fp32():
    x = np.full((1, 1, 8), 256.0, ml_dtypes.bfloat16)
    x[..., 0] = 258.0                                     # deviations far below bf16 resolution of the mean
    params = {"n.scale": jnp.ones(8, jnp.bfloat16), "n.bias": jnp.zeros(8, jnp.bfloat16)}
    norm = layers.LayerNorm(TINY.replace(layer_norm_eps=1e-6), params, "n")
    y = np.asarray(norm(x)).astype(np.float64)
    np.testing.assert_allclose(y[0, 0, 0], np.sqrt(7.0), rtol=2**-7)


def test_a_layer_is_a_pytree_of_its_parameters_with_static_config():
    params = {"n.scale": jnp.ones(8), "n.bias": jnp.zeros(8)}
    norm = layers.LayerNorm(TINY.replace(layer_norm_eps=1e-6), params, "n")
    leaves, treedef = jax.tree.flatten(norm)
    assert len(leaves) == 2 and jax.tree.unflatten(treedef, leaves).eps == 1e-6
    doubled = jax.tree.map(lambda x: 2 * x, norm)                # unflattening calls no __init__
    assert isinstance(doubled, layers.LayerNorm) and float(doubled.scale[0]) == 2.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        norm.eps = 0.1
    assert jax.jit(lambda m, x: m(x))(norm, jnp.arange(8.0)).shape == (8,)
