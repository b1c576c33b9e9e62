"""The reference against independent formulations of the paper (exact mode, float64)."""

from __future__ import annotations

import numpy as np
import pytest

from spec import reference as ref
from spec import search
from spec.config import TINY
from spec.init import init_params
from spec.numerics import BF16, Numerics
from spec.recording import recording
from spec.shapes import intermediates

EXACT = Numerics("exact")


@pytest.fixture(scope="module")
def params():
    return ref.as_float64(init_params(TINY, 3, observable=True), TINY)


def test_positional_encoding_by_hand():
    pe = ref.positional_encoding(50, 8)
    assert pe[0, 0::2].tolist() == [0.0] * 4 and pe[0, 1::2].tolist() == [1.0] * 4
    assert pe[1, 0] == np.sin(1.0) and pe[1, 1] == np.cos(1.0)           # i = 0: wavelength 2*pi
    assert pe[7, 2] == np.sin(7 / 10000 ** (2 / 8)) and pe[7, 3] == np.cos(7 / 10000 ** (2 / 8))
    assert np.isclose(pe[49, 6], np.sin(49 / 10000 ** (6 / 8)), rtol=0, atol=1e-15)


def test_multi_head_attention_is_the_papers_concat_of_heads(params):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)."""
    rng = np.random.default_rng(0)
    xq, xkv = rng.standard_normal((2, 5, TINY.d_model)), rng.standard_normal((2, 7, TINY.d_model))
    mask = np.ones((2, 1, 7), bool)
    mask[1, :, 5:] = False
    p = "decoder.layers.0.cross_attn"
    wq, wk, wv, wo = (params[f"{p}.{n}"] for n in ("w_q", "w_k", "w_v", "w_o"))
    heads = []
    for h in range(TINY.n_heads):
        q, k, v = xq @ wq[:, h], xkv @ wk[:, h], xkv @ wv[:, h]                   # (B, T, K), (B, S, K), (B, S, C)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(TINY.d_k)                           # (B, T, S)
        s = np.where(mask, s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        heads.append((a / a.sum(-1, keepdims=True)) @ v)                           # (B, T, C)
    expected = np.concatenate(heads, axis=-1) @ wo.reshape(TINY.n_heads * TINY.d_v, TINY.d_model)
    attn = ref.layers.MultiHeadAttention(params, p, EXACT)
    got = attn.forward(xq, attn.project_kv(xkv), mask)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_layer_norm_and_ffn_by_hand(params):
    x = np.random.default_rng(1).standard_normal((2, 3, TINY.d_model))
    p = "encoder.layers.0.ffn_norm"
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    expected = (x - mu) / np.sqrt(var + 1e-6) * params[f"{p}.scale"] + params[f"{p}.bias"]
    np.testing.assert_allclose(ref.layer_norm(params, p, x, 1e-6, EXACT), expected, rtol=1e-12, atol=1e-12)
    f = "encoder.layers.0.ffn"
    h = np.maximum(0, x @ params[f"{f}.w_1"] + params[f"{f}.b_1"])
    np.testing.assert_allclose(ref.layers.FeedForward(params, f, "relu", EXACT).forward(x),
                               h @ params[f"{f}.w_2"] + params[f"{f}.b_2"], rtol=1e-12, atol=1e-12)


def test_masks():
    src = np.array([[5, 6, 0], [7, 0, 0]])
    assert ref.key_padding_mask(src, TINY.pad_id).tolist() == [[True, True, False], [True, False, False]]
    assert ref.causal_mask(0, 3, 3)[0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert ref.causal_mask(2, 1, 3)[0].tolist() == [[True, True, True]]  # a decode step sees every earlier key


def test_masked_keys_get_exactly_zero_weight():
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((1, 2, 1, 4)), rng.standard_normal((1, 3, 1, 4)), rng.standard_normal((1, 3, 1, 2))
    mask = np.array([True, True, False])[None, None, None, :]
    v2 = v.copy()
    v2[:, 2] = 1e30  # a masked value, however large, must not leak
    for mode in ("exact", "bfloat16", "float32"):
        nx = Numerics(mode)
        a = ref.scaled_dot_product_attention(q, k, v, mask, nx)
        assert np.array_equal(a, ref.scaled_dot_product_attention(q, k, v2, mask, nx)), mode


def test_fully_masked_query_row_is_finite():
    q, k, v = np.ones((1, 1, 1, 4)), np.ones((1, 2, 1, 4)), np.ones((1, 2, 1, 2))
    out = ref.scaled_dot_product_attention(q, k, v, np.zeros((1, 1, 1, 2), bool), Numerics("bfloat16"))
    assert np.isfinite(out).all()


def test_cached_decoding_equals_full_forward(params):
    """Equal to float64 summation order (exact mode); the faithful modes round that noise away."""
    rng = np.random.default_rng(4)
    src, tgt = rng.integers(3, TINY.vocab_size, (2, 6)), rng.integers(3, TINY.vocab_size, (2, 5))
    src[1, 4:] = 0
    for mode in ("exact", "bfloat16", "float32"):
        nx = Numerics(mode)
        full = ref.forward(params, src, tgt, TINY, nx)
        model = ref.Transformer(params, TINY, nx)
        cache, steps = model.init_cache(model.encode(src), src, 5), []
        for t in range(5):
            logits, cache = model.decode(tgt[:, t:t + 1], cache)
            steps.append(logits)
        steps = np.concatenate(steps, axis=1)
        if mode == "exact":
            np.testing.assert_allclose(steps, full, rtol=0, atol=1e-13)
        else:
            assert np.array_equal(full, steps), mode


def test_faithful_rounding_points_hold_bf16_values(params):
    src, tgt = np.array([[4, 5, 6]]), np.array([[1, 7]])
    with recording() as rec:
        ref.forward(params, src, tgt, TINY, Numerics("bfloat16"))
    assert list(rec) == list(intermediates(TINY, 1, 3, 2))
    for name, x in rec.items():
        if name != "logits":
            assert np.array_equal(x, x.astype(BF16).astype(np.float64)), f"{name} is not bf16-representable"


def _constant_logits(logits_row):
    """A stand-in for Transformer.decode that returns the same logits at every step."""
    def decode(self, tokens, cache):
        cache.length += tokens.shape[1]
        return np.broadcast_to(logits_row, (tokens.shape[0], 1, len(logits_row))).copy(), cache
    return decode


def test_greedy_ties_break_toward_lower_id(params, monkeypatch):
    row = np.zeros(TINY.vocab_size)
    row[[9, 5, 7]] = 3.0  # an exact three-way tie
    monkeypatch.setattr(ref.Transformer, "decode", _constant_logits(row))
    out = search.greedy_search(params, np.array([[4, 5]]), TINY, EXACT, max_new_tokens=3)
    assert out.tolist() == [[5, 5, 5]]


def test_beam_ties_break_toward_lower_flat_index(params, monkeypatch):
    row = np.full(TINY.vocab_size, -5.0)
    row[[TINY.eos_id, 11, 8]] = [-50.0, 2.0, 2.0]  # EOS never competes: the answer is the best alive hypothesis
    monkeypatch.setattr(ref.Transformer, "decode", _constant_logits(row))
    out = search.beam_search(params, np.array([[4, 5]]), TINY, EXACT, beam_size=2, alpha=0.6, max_new_tokens=2)
    assert out.tolist() == [[8, 8]]  # all four candidates tie at step 2; beam 0 (token 8) with token 8 comes first


def test_length_penalty():
    assert search.length_penalty(1, 0.6) == 1.0
    assert np.isclose(search.length_penalty(7, 0.6), 2.0 ** 0.6)
    assert search.length_penalty(30, 0.0) == 1.0
