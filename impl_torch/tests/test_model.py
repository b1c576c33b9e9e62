"""The model: canonical parameters, shapes and dtypes, mixed dtypes, masks, KV cache, devices, input validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import impl_torch
from spec import TINY, init_params, preset, shapes
from spec import reference as ref
from spec.numerics import Numerics, np_dtype
from spec.schema import param_specs

# Logit differences allowed where only the order of fp32 sums may change (batch size, sequence length): a flipped
# bf16 rounding propagates, but a broken mask or cache is off by much more (logits here are O(1)).
TOL = {torch.bfloat16: 0.1, torch.float32: 1e-4}


def _tol(model):
    return TOL[impl_torch.layers.DTYPES[model.config.dtype]]


def _rms_rel_err(got: torch.Tensor, want: np.ndarray) -> float:
    """RMS of ``got - want`` relative to the RMS of ``want`` (float64)."""
    return float(np.sqrt(((got.numpy().astype(np.float64) - want) ** 2).mean() / (want ** 2).mean()))


def test_state_dict_is_the_canonical_schema(model):
    sd = model.state_dict()
    specs = param_specs(model.config)
    assert list(sd) == [s.name for s in specs]                              # canonical names, canonical order
    for s in specs:
        assert tuple(sd[s.name].shape) == s.shape, s.name
        assert sd[s.name].dtype == impl_torch.layers.DTYPES[s.dtype], s.name


def test_forward_shapes_dtypes_and_intermediates(model, ids):
    B, S, T = 2, 9, 7
    logits, inter = model(ids(0, B, S), ids(1, B, T, bos=True), intermediates=True)
    for name, (shape, dtype) in shapes.intermediates(model.config, B, S, T).items():
        assert tuple(inter[name].shape) == shape, name
        want = torch.float32 if dtype == "float32" else impl_torch.layers.DTYPES[dtype]
        assert inter[name].dtype == want, name
    assert inter["logits"] is logits and sorted(inter) == sorted(shapes.intermediates(model.config, B, S, T))


def test_numpy_and_torch_inputs_agree(model, ids):
    src, tgt = ids(2, 2, 5), ids(3, 2, 4, bos=True)
    torch.testing.assert_close(model(src.numpy(), tgt.numpy()), model(src, tgt), rtol=0, atol=0)


def test_causal_mask_hides_later_targets(model, ids):
    src, tgt = ids(4, 2, 6), ids(5, 2, 8, bos=True)
    later = tgt.clone()
    later[:, 5:] = 3 + (later[:, 5:] - 3 + 11) % (TINY.vocab_size - 3)
    a, b = model(src, tgt), model(src, later)
    torch.testing.assert_close(a[:, :5], b[:, :5], rtol=0, atol=_tol(model))
    assert (a[:, 5:] != b[:, 5:]).any()


def test_key_padding_mask_hides_padding(model, ids):
    src, tgt = ids(6, 2, 6), ids(7, 2, 5, bos=True)
    src[1, 3:] = TINY.pad_id
    padded = model(torch.nn.functional.pad(src, (0, 4)), torch.nn.functional.pad(tgt, (0, 3)))
    assert torch.isfinite(padded).all()
    torch.testing.assert_close(padded[:, :5], model(src, tgt), rtol=0, atol=_tol(model))


@settings(max_examples=15, deadline=None)
@given(lengths=st.lists(st.integers(1, 6), min_size=1, max_size=3), extra=st.integers(1, 4), seed=st.integers(0, 99))
def test_padding_never_reaches_real_positions(lengths, extra, seed, ids, tiny):
    """Any amount of source and target padding leaves the logits at real target positions unchanged."""
    model = tiny("float32")
    B = len(lengths)
    src, tgt = ids(seed, B, 6), ids(seed + 1, B, 5, bos=True)
    for b, n in enumerate(lengths):
        src[b, n:] = TINY.pad_id
        tgt[b, n:] = TINY.pad_id
    padded = model(torch.nn.functional.pad(src, (0, extra)), torch.nn.functional.pad(tgt, (0, extra)))
    real = tgt != TINY.pad_id
    torch.testing.assert_close(padded[:, :5][real], model(src, tgt)[real], rtol=0, atol=TOL[torch.float32])


def test_cached_decoding_equals_full_forward(model, ids):
    src, tgt = ids(8, 3, 7), ids(9, 3, 6, bos=True)
    tgt[2, 4:] = TINY.pad_id
    full = model(src, tgt)
    cache = model.init_cache(model.encode(src), src, capacity=6)
    steps = torch.cat([model.decode(tgt[:, :2], cache)] + [model.decode(tgt[:, t:t + 1], cache) for t in range(2, 6)],
                      dim=1)
    valid = tgt != TINY.pad_id
    torch.testing.assert_close(steps[valid], full[valid], rtol=0, atol=_tol(model))
    assert cache.length == 6


def test_cache_has_no_room_for_more(ids, tiny):
    m = tiny()
    src = ids(10, 1, 4)
    cache = m.init_cache(m.encode(src), src, capacity=2)
    m.decode(torch.tensor([[1, 5]]), cache)
    with pytest.raises(ValueError, match="exceed the cache capacity 2"):
        m.decode(torch.tensor([[5]]), cache)


@pytest.mark.parametrize("capacity", [2.5, True, 0, 65, np.float64(4)])
def test_cache_capacity_is_an_int_in_1_to_max_len(capacity, ids, tiny):
    m = tiny()
    src = ids(17, 1, 4)
    with pytest.raises(ValueError, match=r"capacity must be an int in \[1, max_len=64\], got "):
        m.init_cache(m.encode(src), src, capacity)


def test_numpy_capacity_and_negative_stride_ids_accepted(model, ids):
    """NumPy integer capacity and chunk sizes; reversed NumPy views (negative strides) as ids."""
    src, tgt = ids(18, 2, 6).numpy()[::-1], ids(19, 2, 5, bos=True).numpy()[::-1]
    assert src.strides[0] < 0
    cache = model.init_cache(model.encode(src), src, np.int64(7))
    n = np.int64(3)
    steps = torch.cat([model.decode(tgt[:, :n], cache), model.decode(tgt[:, n:], cache)], dim=1)
    torch.testing.assert_close(steps, model(src.copy(), tgt.copy()), rtol=0, atol=_tol(model))
    assert cache.capacity == 7 and cache.length == 5


@pytest.mark.parametrize("bad, pattern", [
    (lambda s: s.float(), r"src: token ids must be integers"),
    (lambda s: s.numpy().astype(np.float64), r"src: token ids must be integers"),
    (lambda s: s[0], r"src: expected shape \(batch, length\)"),
    (lambda s: s.masked_fill(s == s[0, 0], TINY.vocab_size), r"src: token id 61 outside"),
    (lambda s: torch.zeros_like(s), r"src: sequence 0 is all padding"),
])
def test_bad_input_raises_the_specs_error_everywhere(bad, pattern, ids, tiny):
    m = tiny()
    src = bad(ids(11, 2, 5))
    for call in (lambda: m(src, ids(12, 2, 3)), lambda: m.encode(src), lambda: impl_torch.greedy_search(m, src),
                 lambda: impl_torch.beam_search(m, src)):
        with pytest.raises(ValueError, match=pattern):
            call()


def test_float32_config_computes_in_float32(ids, tiny):
    m = tiny("float32")
    _, inter = m(ids(13, 1, 4), ids(14, 1, 3, bos=True), intermediates=True)
    assert {t.dtype for t in inter.values()} == {torch.float32}


@pytest.mark.parametrize("dtype, param_dtype", [("float32", "bfloat16"), ("bfloat16", "float32")])
def test_mixed_dtypes_compute_in_the_config_dtype_with_cast_parameters(dtype, param_dtype, ids):
    """Rule 0: activations in ``config.dtype`` whatever the parameters' dtype, and the very logits of the
    ``config.dtype`` model holding the cast parameters."""
    c = preset("tiny", dtype=dtype, param_dtype=param_dtype)
    params = init_params(c, 3, observable=True)
    src, tgt = ids(30, 2, 7), ids(31, 2, 6, bos=True)
    with torch.no_grad():
        logits, inter = impl_torch.from_params(c, params)(src, tgt, intermediates=True)
        cast = {k: v.astype(np_dtype(dtype)) for k, v in params.items()}
        same = impl_torch.from_params(c.replace(param_dtype=dtype), cast)(src, tgt)
    for name, (_, want) in shapes.intermediates(c, 2, 7, 6).items():
        assert inter[name].dtype == impl_torch.layers.DTYPES[want], name
    torch.testing.assert_close(logits, same, rtol=0, atol=0)


def test_float32_compute_with_bf16_parameters_matches_the_float32_reference(ids):
    c = preset("tiny", dtype="float32", param_dtype="bfloat16")
    params = init_params(c, 4, observable=True)
    src, tgt = ids(32, 2, 7), ids(33, 2, 6, bos=True)
    with torch.no_grad():
        logits = impl_torch.from_params(c, params)(src, tgt).numpy().astype(np.float64)
    want = ref.forward(ref.as_float64(params, c), src.numpy(), tgt.numpy(), c, Numerics("float32"))
    assert np.abs(logits - want).max() < 1e-5 * np.sqrt((want ** 2).mean())


def test_bf16_compute_rounds_fp32_parameters_before_use(ids):
    """The bf16-faithful reference of the bf16-rounded weights, not of the fp32 ones (rounding the weights moves
    the logits by ~1% of their RMS here; the model is ~1e-8 from the former)."""
    c = preset("tiny", dtype="bfloat16", param_dtype="float32")
    params = init_params(c, 5, observable=True)
    src, tgt = ids(34, 2, 7), ids(35, 2, 6, bos=True)
    with torch.no_grad():
        logits = impl_torch.from_params(c, params)(src, tgt)
    run = lambda p: ref.forward(p, src.numpy(), tgt.numpy(), c, Numerics("bfloat16"))  # noqa: E731
    rounded, unrounded = run(ref.as_float64(params, c)), run(ref.as_float64(params, c.replace(dtype="float32")))
    assert _rms_rel_err(logits, rounded) < 0.01 * _rms_rel_err(logits, unrounded)


def test_paper_initialisation():
    m = impl_torch.Transformer(TINY)
    assert m.training and m.embedding.dtype == torch.bfloat16
    assert (m.encoder.layers[0].ffn_norm.scale == 1).all() and (m.encoder.layers[0].ffn.b_1 == 0).all()
    a = (6.0 / (TINY.d_model + TINY.d_ff)) ** 0.5
    assert m.encoder.layers[0].ffn.w_1.float().abs().max() <= a


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu(ids, tiny):
    cpu = tiny()
    gpu = impl_torch.from_params(cpu.config, impl_torch.params_of(cpu), device="cuda")
    src, tgt = ids(15, 2, 6), ids(16, 2, 5, bos=True)
    torch.testing.assert_close(gpu(src.cuda(), tgt.cuda()).cpu(), cpu(src, tgt), rtol=0, atol=TOL[torch.bfloat16])
