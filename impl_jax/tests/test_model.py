"""The model: shapes and dtypes, masks, the KV cache, validation before tracing, compilation counts."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import impl_jax
from impl_jax import model
from spec import reference as ref
from spec import shapes
from spec.numerics import Numerics, np_dtype


def _tol(c) -> float:
    """A loose bound on a logit difference from reordered fp32 sums (a few flipped bf16 roundings)."""
    return 0.1 if c.dtype == "bfloat16" else 1e-4


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_forward_matches_the_spec_reference(dtype, make, tokens):
    c, params = make(dtype)
    src, tgt = tokens(c, 1, 2, 7), tokens(c, 2, 2, 5, bos=True)
    src[1, 5:] = c.pad_id
    logits = np.asarray(impl_jax.forward(params, c, src, tgt))
    exact = ref.forward(ref.as_float64(impl_jax.to_flat(params), c), src, tgt, c, Numerics(c.dtype))
    assert logits.dtype == np.float32 and logits.shape == (2, 5, c.vocab_size)
    np.testing.assert_allclose(logits, exact, atol=_tol(c))


def test_intermediates_are_named_and_shaped_as_the_spec_says(tiny, tokens):
    c, params = tiny
    logits, inter = impl_jax.forward(params, c, tokens(c, 1, 2, 7), tokens(c, 2, 2, 5, bos=True), True)
    inter["logits"] = logits
    want = shapes.intermediates(c, 2, 7, 5)
    assert sorted(inter) == sorted(want)
    for name, (shape, dtype) in want.items():
        assert inter[name].shape == shape and np.dtype(inter[name].dtype) == np_dtype(dtype), name


def test_causal_mask_and_key_padding(tiny, tokens):
    c, params = tiny
    src, tgt = tokens(c, 3, 2, 7), tokens(c, 4, 2, 5, bos=True)
    src[1, 4:] = c.pad_id
    base = np.asarray(impl_jax.forward(params, c, src, tgt))
    later = tgt.copy()
    later[:, 3:] = 3
    np.testing.assert_array_equal(np.asarray(impl_jax.forward(params, c, src, later))[:, :3], base[:, :3])
    padded = np.asarray(impl_jax.forward(params, c, np.pad(src, ((0, 0), (0, 3))), np.pad(tgt, ((0, 0), (0, 2)))))
    assert np.isfinite(padded).all()
    np.testing.assert_allclose(padded[:, :5], base, atol=_tol(c))


def test_kv_cache_one_token_at_a_time_and_in_chunks_matches_forward(tiny, tokens):
    c, params = tiny
    src, tgt = tokens(c, 5, 2, 7), tokens(c, 6, 2, 5, bos=True)
    tgt[0, 4] = c.pad_id
    full = np.asarray(impl_jax.forward(params, c, src, tgt))
    memory = impl_jax.encode(params, c, src)
    cache = impl_jax.init_cache(params, c, memory, src, capacity=6)
    steps = []
    for a, b in ((0, 1), (1, 3), (3, 4), (4, 5)):              # chunks of 1 and 2 tokens
        logits, cache = impl_jax.decode(params, c, tgt[:, a:b], cache)
        steps.append(np.asarray(logits))
    assert int(cache.length) == 5 and cache.capacity == 6
    np.testing.assert_allclose(np.concatenate(steps, axis=1)[tgt != c.pad_id], full[tgt != c.pad_id], atol=_tol(c))
    with pytest.raises(ValueError, match="exceed the cache capacity 6"):
        impl_jax.decode(params, c, tgt[:, :2], cache)


@pytest.mark.parametrize("call, pattern", [
    (lambda p, c, s: impl_jax.forward(p, c, s.astype(np.float32), s), "src: token ids must be integers"),
    (lambda p, c, s: impl_jax.forward(p, c, s, np.where(s == s[0, 0], c.vocab_size, s)), "tgt_in: token id 61"),
    (lambda p, c, s: impl_jax.encode(p, c, jnp.asarray(s) * 0), "src: sequence 0 is all padding"),
    (lambda p, c, s: impl_jax.decode(p, c, -s, impl_jax.init_cache(p, c, impl_jax.encode(p, c, s), s, 8)),
     "tokens: token id -"),
    (lambda p, c, s: impl_jax.init_cache(p, c, impl_jax.encode(p, c, s), s, c.max_len + 1), "capacity must be"),
], ids=["float_ids", "id_at_vocab_size", "all_pad_device_array", "negative_decode_id", "capacity"])
def test_bad_input_raises_before_tracing(tiny, call, pattern, tokens):
    c, params = tiny
    before = model._forward._cache_size()
    with pytest.raises(ValueError, match=pattern):
        call(params, c, tokens(c, 7, 2, 7))
    assert model._forward._cache_size() == before


def test_forward_compiles_once_per_shape(tiny, tokens):
    c, params = tiny
    before = model._forward._cache_size()
    for seed in range(3):                                      # new data, same shapes: no new compilation
        impl_jax.forward(params, c, tokens(c, seed, 1, 7), tokens(c, seed, 1, 5, bos=True))
    assert model._forward._cache_size() == before + 1
    impl_jax.forward(params, c, tokens(c, 0, 1, 8), tokens(c, 0, 1, 5, bos=True))
    assert model._forward._cache_size() == before + 2


def test_bf16_parameters_in_a_float32_model_compute_in_float32(tiny, tokens):
    c, params = tiny
    c32 = c.replace(dtype="float32")
    logits, inter = impl_jax.forward(params, c32, tokens(c, 1, 2, 7), tokens(c, 2, 2, 5, bos=True), True)
    assert inter["encoder.out"].dtype == jnp.float32 and logits.dtype == jnp.float32
