"""Layers against the contract: rounding points, positional encoding, attention masks; the numerics context."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import impl_torch
from impl_torch.numerics import linear
from spec import TINY
from spec.numerics import BF16
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


def test_linear_accumulates_in_fp32_and_rounds_once_after_the_bias():
    x, w, b = _bf16(3, 4, 64, seed=1), _bf16(64, 16, seed=2), _bf16(16, seed=3)
    y = linear(x, w, b)
    exact = np.einsum("bld,df->blf", x.double().numpy(), w.double().numpy()) + b.double().numpy()
    once = exact.astype(np.float32).astype(BF16)                           # fp32 accumulator, one bf16 rounding
    assert y.dtype == torch.bfloat16
    # fp32 summation order may move a result across a bf16 rounding boundary only when it lies within ~2^-16 ulp
    differ = (impl_torch.to_array(y) != once).mean()
    assert differ < 0.01, f"{differ:.1%} of results differ from one rounding of the exact value"


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


def _flags():
    return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction)


def test_numerics_scope_sets_the_flags_and_restores_them():
    before = _flags()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        with impl_torch.numerics_scope():
            assert _flags() == (False, False, False)
        assert _flags() == (True, True, before[2])
        with pytest.raises(RuntimeError, match="inside"), impl_torch.numerics_scope():
            raise RuntimeError("inside")
        assert _flags() == (True, True, before[2])                          # restored on an exception too
    finally:
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
         torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction) = before


@pytest.mark.parametrize("native", [False, True], ids=["fp32_gemm", "native_bf16_gemm"])
def test_building_running_and_training_a_model_changes_no_flag(native, ids):
    mkldnn = torch.backends.mkldnn
    before = (_flags(), mkldnn.fp32_precision, mkldnn.matmul.fp32_precision)
    model = impl_torch.Transformer(TINY, native_bf16=native)
    impl_torch.greedy_search(model, ids(0, 1, 4), max_new_tokens=3)
    src, tgt = ids(1, 2, 5), ids(2, 2, 4, bos=True)
    impl_torch.train_step(model, impl_torch.init_train_state(model), src, tgt, tgt)
    assert (_flags(), mkldnn.fp32_precision, mkldnn.matmul.fp32_precision) == before


def test_native_logits_are_the_fp32_product_of_the_bf16_operands():
    """``logits`` with ``native_bf16`` (oneDNN's bf16 GEMM with an fp32 result): fp32, never rounded to bf16, and
    within fp32 accumulation of the exact product of the bf16 operands, as the default fp32 GEMM is."""
    x, table = _bf16(4, 16, 512, seed=5), _bf16(1000, 512, seed=6).float()               # the table as it enters
    exact = x.double() @ table.double().T                                                 # (4, 16, 1000)
    size = x.double().abs() @ table.double().abs().T
    for native in (False, True):
        got = impl_torch.numerics.logits(x, table, native_bf16=native)
        assert got.dtype == torch.float32 and not torch.equal(got, got.bfloat16().float())
        assert ((got.double() - exact).abs() <= 2.0 ** -18 * size).all()


@pytest.mark.parametrize("native", [False, True], ids=["fp32_gemm", "native_bf16_gemm"])
def test_cpu_bf16_linear_rounds_once_after_the_bias_on_either_path(native):
    """Both CPU paths of ``linear`` (``native_bf16``) compute round(x W + b) with fp32 accumulation: only the
    fp32 summation order may flip a rounding, never the double rounding a bias added after the product would make
    (which changes ~30% of the results)."""
    x, w, b = _bf16(64, 256, seed=1), _bf16(256, 384, seed=2, scale=256 ** -0.5), _bf16(384, seed=3)
    with torch.inference_mode():
        got = linear(x, torch.nn.Parameter(w, requires_grad=False), b, native_bf16=native)  # (64, 384) bf16
    want = (x.double() @ w.double() + b.double()).float().bfloat16()                      # rounded once
    assert got.dtype == torch.bfloat16
    assert (got != want).float().mean() < 1e-3
    assert ((got.double() - want.double()).abs() <= want.double().abs() * 2.0 ** -7).all()  # at most one ulp


def _linear_and_grads(native: bool, x, w, b, dy) -> tuple[torch.Tensor, ...]:
    """y = ``linear(x, w, b)`` under autograd on the native (True) or fp32 (False) CPU path, and dx, dw, db."""
    x, w, b = (t.detach().clone().requires_grad_() for t in (x, w, b))
    y = linear(x, w, b, native_bf16=native)                                               # (rows, O) bf16
    assert (type(y.grad_fn.next_functions[0][0]).__name__ == "_NativeLinearBackward") == native  # under a view
    return (y.detach(), *torch.autograd.grad(y, (x, w, b), dy))


def test_cpu_bf16_linear_training_paths_agree():
    """The two CPU training paths of ``linear``: native bf16 GEMMs (``_NativeLinear``) and fp32 GEMMs of the upcast
    operands (autograd through ``round_to``). db is the same bits; dW is an fp32 product of the exact bf16 operands
    on both (oneDNN's bf16 GEMM with an fp32 result on the native path: another fp32 summation order), not rounded
    to bf16, passed straight through the weight's bf16 rounding; a bf16 master gets it rounded once. y and dx, each
    rounded once from an fp32 accumulator on both paths, differ only where the two GEMMs' fp32 summation orders
    differ by more than the result's bf16 ulp: results that cancel heavily (|x W| far below |x| |W|), a few in
    10^4, each within one rounding of an fp32 sum of the exact value."""
    x, dy = _bf16(256, 512, seed=1), _bf16(256, 1024, seed=4)                             # (rows, I), (rows, O)
    w = 512 ** -0.5 * torch.randn(512, 1024, generator=torch.Generator().manual_seed(2))   # (I, O) fp32 master
    b = torch.randn(1024, generator=torch.Generator().manual_seed(3))                     # (O,) fp32 master
    fp32, native = _linear_and_grads(False, x, w, b, dy), _linear_and_grads(True, x, w, b, dy)
    y, dx, dw, db = native
    assert y.dtype == dx.dtype == torch.bfloat16 and dw.dtype == db.dtype == torch.float32
    assert torch.equal(db, fp32[3]) and torch.equal(db, dy.float().sum(0))
    exact_dw, size_dw = x.double().T @ dy.double(), x.double().abs().T @ dy.double().abs()
    for v in (dw, fp32[2]):                                                                # fp32 accumulation
        assert ((v.double() - exact_dw).abs() <= 2.0 ** -18 * size_dw).all()
    assert not torch.equal(dw, dw.bfloat16().float())                                    # fp32, not bf16 values
    w16, b16 = w.bfloat16(), b.bfloat16()
    for master in (w16.float(), w16):  # straight-through: the bf16 weight's gradient, in the master's dtype
        got = _linear_and_grads(True, x, master, b16.to(master.dtype), dy)
        assert torch.equal(got[0], y) and torch.equal(got[1], dx)
        assert got[2].dtype == master.dtype and torch.equal(got[2], dw.to(master.dtype))
    exact_y, size_y = x.double() @ w16.double() + b16.double(), x.double().abs() @ w16.double().abs() + b16.abs()
    exact_dx, size_dx = dy.double() @ w16.double().T, dy.double().abs() @ w16.double().abs().T
    for got, want, exact, size in ((y, fp32[0], exact_y, size_y), (dx, fp32[1], exact_dx, size_dx)):
        assert (got != want).float().mean() < 1e-3                                         # a few in 10^4
        for v in (got.double(), want.double()):  # |round(s) - s| <= 2^-8 |s|, |s - exact| <= a few 2^-24 sum |t|
            assert ((v - exact).abs() <= 2.0 ** -8 * exact.abs() + 2.0 ** -18 * size).all()


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
