"""Layers against the contract: positional encoding, LayerNorm, attention masks, residual lines, recording, the
``native_bf16`` option, the kept rounded embedding table (the products and the numerics context:
``test_numerics.py``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import impl_torch
from spec import TINY
from spec.recording import record, recording, scope


def _bf16(*shape, seed=0, scale=1.0):
    return (scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))).bfloat16()


def test_positional_encoding_is_the_papers_interleaved_table():
    pe = impl_torch.layers.positional_encoding(50, 8)
    assert pe.dtype == torch.float32 and pe.shape == (50, 8)
    pos, i = np.arange(50)[:, None], np.arange(0, 8, 2)[None, :]
    angle = pos / 10000.0 ** (i / 8)
    np.testing.assert_array_equal(pe[:, 0::2].numpy(), np.sin(angle).astype(np.float32))
    np.testing.assert_array_equal(pe[:, 1::2].numpy(), np.cos(angle).astype(np.float32))


def test_layer_norm_statistics_in_fp32():
    x = _bf16(2, 5, 32, seed=4, scale=1e-3)                                # variance ~ eps: eps is visible
    scale, bias = _bf16(32, seed=5).abs() + 0.5, _bf16(32, seed=6)
    params = {"n.scale": impl_torch.to_array(scale), "n.bias": impl_torch.to_array(bias)}
    norm = impl_torch.layers.LayerNorm(TINY.replace(d_model=32, layer_norm_eps=1e-6), params, "n")
    y = norm(x)
    xd = x.double()
    ref = (xd - xd.mean(-1, keepdim=True)) / torch.sqrt(xd.var(-1, unbiased=False, keepdim=True) + 1e-6)
    ref = (ref * scale.double() + bias.double()).float().bfloat16()
    assert y.dtype == torch.bfloat16
    assert (y.float() - ref.float()).abs().max() <= 2 ** -6 * ref.float().abs().max()


def _attention_inputs(dtype=torch.float32):
    """q (B, T, H, K), heads-major k (B, H, S, K), v (B, H, S, C), mask (B, 1, T, S)."""
    B, H, T, S, K, C = 2, 3, 4, 6, 16, 8
    q, k, v = _bf16(B, T, H, K, seed=7), _bf16(B, H, S, K, seed=8), _bf16(B, H, S, C, seed=9)
    mask = torch.ones(B, 1, T, S, dtype=torch.bool)
    mask[1, ..., 4:] = False                                                # row 1: keys 4.. are padding
    return q.to(dtype), k.to(dtype), v.to(dtype), mask


def test_masked_keys_get_exactly_zero_weight():
    q, k, v, mask = _attention_inputs()
    out = impl_torch.layers.scaled_dot_product_attention(q, k, v, mask)
    assert out.shape == (2, 4, 3, 8)                                        # (B, T, H, C)
    v2 = v.clone()
    v2[1, :, 4:] = 1e4                                                      # change only masked keys' values
    k2 = k.clone()
    k2[1, :, 4:] = -k2[1, :, 4:]
    torch.testing.assert_close(impl_torch.layers.scaled_dot_product_attention(q, k2, v2, mask), out, rtol=0, atol=0)


def test_fully_masked_query_rows_are_finite():
    q, k, v, mask = _attention_inputs(torch.bfloat16)
    mask[0, :, 2] = False                                                   # query 2 of row 0 sees no key
    assert torch.isfinite(impl_torch.layers.scaled_dot_product_attention(q, k, v, mask).float()).all()


def test_plain_attention_is_equation_1():
    q, k, v, mask = _attention_inputs()
    qh, kh, vh = q.double().transpose(1, 2), k.double(), v.double()          # (B, H, L, K)
    scores = (qh @ kh.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    probs = torch.softmax(scores.masked_fill(~mask, -math.inf), dim=-1)
    want = (probs @ vh).transpose(1, 2)                                     # (B, T, H, C)
    torch.testing.assert_close(impl_torch.layers.scaled_dot_product_attention(q, k, v, mask).double(), want)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_residual_lines_post_and_pre_norm(tiny, norm_first):
    """Post-LN (the paper): norm(x + sublayer(x)); pre-LN: x + sublayer(norm(x)); each line recorded."""
    layer, x = tiny(norm_first=norm_first).encoder.layers[0], _bf16(2, 3, 32, seed=10)
    with torch.inference_mode(), recording() as rec:
        out = layer(x, torch.ones(2, 1, 1, 3, dtype=torch.bool))
    mid, ffn = rec["self_attn.residual"], rec["ffn"]
    if norm_first:
        torch.testing.assert_close(ffn, layer.ffn(layer.ffn_norm(mid)), rtol=0, atol=0)
        torch.testing.assert_close(out, mid + ffn, rtol=0, atol=0)
    else:
        torch.testing.assert_close(ffn, layer.ffn(mid), rtol=0, atol=0)
        torch.testing.assert_close(out, layer.ffn_norm(mid + ffn), rtol=0, atol=0)
    assert rec["ffn.residual"] is out


def test_record_is_a_no_op_outside_recording_and_scopes_nest_inside(tiny):
    x = _bf16(2, 3, 32, seed=12)
    with scope("outer"):
        assert record("x", x) is x                                          # not recording: nothing is kept
    with recording() as rec:
        pass
    assert rec == {}                                                        # a block that records nothing
    with recording() as rec:
        record("top", x)
        with scope("encoder"), scope("layers.0"):
            record("out", x)
        tiny().encoder.layers[0](x, torch.ones(2, 1, 1, 3, dtype=torch.bool))  # a layer records relative names
    assert rec.keys() == {"top", "encoder.layers.0.out", "self_attn", "self_attn.residual", "ffn", "ffn.residual"}
    assert rec["top"] is x
    record("after", x)
    assert "after" not in rec                                               # the block has closed


@pytest.mark.parametrize("native", [False, True])
def test_native_bf16_is_a_constructor_option_shown_in_repr_and_passed_to_every_product(native):
    L, model = impl_torch.layers, impl_torch.Transformer(TINY, native_bf16=native)
    assert f"native_bf16={native}" in repr(model)
    products = [m for m in model.modules() if isinstance(m, L.MultiHeadAttention | L.FeedForward)]
    assert len(products) == 3 * TINY.n_decoder_layers + 2 * TINY.n_encoder_layers
    assert all(m.native_bf16 is native for m in products)
    assert impl_torch.Transformer(TINY).native_bf16 is False                              # the default


def _decoded(model, src):
    with torch.no_grad():
        cache = model.init_cache(model.encode(src), src, capacity=4)
        return model.decode([[1]], cache)[0]


def test_the_kept_rounded_table_follows_every_change_of_the_table():
    """Outside autograd the rounded table is kept with the model: each change of the table (written in place, as
    an optimizer or load_state_dict does; other memory behind it, as ``Module.to`` gives) is seen by the next
    decode, which gives what a model built from the changed weights gives."""
    config, src = TINY.replace(param_dtype="float32"), [[5, 9, 17, 2]]
    model, other = impl_torch.Transformer(config, seed=0), impl_torch.Transformer(config, seed=1)
    _decoded(model, src)
    with torch.no_grad():
        model.embedder.table.mul_(1.5)
    want = impl_torch.from_params(config, impl_torch.params_of(model))
    torch.testing.assert_close(_decoded(model, src), _decoded(want, src), rtol=0, atol=0)
    model.load_state_dict(other.state_dict())
    torch.testing.assert_close(_decoded(model, src), _decoded(other, src), rtol=0, atol=0)
    model.embedder.table.data = other.embedder.table.detach() * 2      # another tensor's memory, as .to() gives
    want = impl_torch.from_params(config, impl_torch.params_of(model))
    torch.testing.assert_close(_decoded(model, src), _decoded(want, src), rtol=0, atol=0)


def test_a_model_that_decoded_still_copies_and_pickles():
    import copy
    import io

    model, src = impl_torch.Transformer(TINY, seed=0), [[5, 9, 17, 2]]
    want = _decoded(model, src)
    buf = io.BytesIO()
    torch.save(model, buf)
    loaded = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    for twin in (copy.deepcopy(model), loaded):
        torch.testing.assert_close(_decoded(twin, src), want, rtol=0, atol=0)
