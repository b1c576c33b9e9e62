"""The model: initialisation, canonical parameters, shapes and dtypes, mixed dtypes and casts, devices, input
validation (the KV cache: ``test_cache.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

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


def test_numpy_list_and_torch_inputs_agree(model, ids):
    src, tgt = ids(2, 2, 5), ids(3, 2, 4, bos=True)
    torch.testing.assert_close(model(src.numpy(), tgt.numpy()), model(src, tgt), rtol=0, atol=0)
    torch.testing.assert_close(model(src.tolist(), tgt.tolist()), model(src, tgt), rtol=0, atol=0)


def test_numpy_capacity_and_negative_stride_ids_accepted(model, ids):
    """NumPy integer capacity and chunk sizes; reversed NumPy views (negative strides) as ids."""
    src, tgt = ids(18, 2, 6).numpy()[::-1], ids(19, 2, 5, bos=True).numpy()[::-1]
    assert src.strides[0] < 0
    cache = model.init_cache(model.encode(src), src, np.int64(7))
    n = np.int64(3)
    first, cache = model.decode(tgt[:, :n], cache)
    rest, cache = model.decode(tgt[:, n:], cache)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), model(src.copy(), tgt.copy()), rtol=0,
                               atol=_tol(model))
    assert cache.key_mask.shape[1] == 7 and cache.length == 5


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


@pytest.mark.parametrize("config", [TINY, TINY.replace(param_dtype="float32", norm_first=True)])
def test_constructor_holds_the_specs_init_params(config):
    """Bit for bit spec.init_params(config, seed), seed 0 by default, drawn without torch's RNG; training mode."""
    rng = torch.random.get_rng_state()
    for model, seed in ((impl_torch.Transformer(config, seed=3), 3), (impl_torch.Transformer(config), 0)):
        assert model.training and model.config == config
        got, want = impl_torch.params_of(model), init_params(config, seed)
        assert list(got) == list(want)
        assert all(got[n].dtype == a.dtype and got[n].tobytes() == a.tobytes() for n, a in want.items())
    assert torch.equal(torch.random.get_rng_state(), rng)


@pytest.mark.parametrize("seed", [-1, 1.0, True, None])
def test_bad_seed_raises_the_specs_error(seed):
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        impl_torch.Transformer(TINY, seed)


def test_dropout_only_with_a_generator(ids):
    """Dropout draws from the generator passed as ``rng`` (the same masks for the same seed), never from torch's
    global RNG; without one the forward is evaluation, whatever the module's mode."""
    model = impl_torch.Transformer(TINY.replace(dropout=0.5))
    src, tgt = ids(41, 2, 6), ids(42, 2, 5, bos=True)
    rng, global_rng = torch.Generator().manual_seed(3), torch.random.get_rng_state()
    first, second = model(src, tgt, rng=rng), model(src, tgt, rng=rng)
    assert not torch.equal(first, second)
    torch.testing.assert_close(model(src, tgt, rng=torch.Generator().manual_seed(3)), first, rtol=0, atol=0)
    assert torch.equal(torch.random.get_rng_state(), global_rng)
    assert model.training
    torch.testing.assert_close(model(src, tgt), model.eval()(src, tgt), rtol=0, atol=0)


@pytest.mark.parametrize("dtype, cast, param_dtype", [
    ("float32", torch.nn.Module.bfloat16, "bfloat16"),
    ("float32", lambda m: m.to(torch.bfloat16), "bfloat16"),
    ("bfloat16", torch.nn.Module.float, "float32"),
    ("bfloat16", lambda m: m.to("cpu", torch.float32), "float32"),
])
def test_a_cast_to_bf16_or_fp32_sets_param_dtype(dtype, cast, param_dtype, ids):
    """The config stays true: param_dtype follows the parameters, dtype stays, and the model computes as the one
    built with that config from the cast parameters (rule 0); the PE table stays fp32."""
    c = preset("tiny", dtype=dtype, param_dtype=dtype)
    params = init_params(c, 6, observable=True)
    model = impl_torch.from_params(c, params)
    assert cast(model) is model
    assert model.config == c.replace(param_dtype=param_dtype)
    assert {p.dtype for p in model.parameters()} == {impl_torch.layers.DTYPES[param_dtype]}
    assert model.embedder.pe.dtype == torch.float32
    pe = impl_torch.layers.positional_encoding(c.max_len, c.d_model)
    torch.testing.assert_close(model.embedder.pe, pe, rtol=0, atol=0)
    same = impl_torch.from_params(model.config, {k: v.astype(np_dtype(param_dtype)) for k, v in params.items()})
    src, tgt = ids(43, 2, 6), ids(44, 2, 5, bos=True)
    torch.testing.assert_close(model(src, tgt), same(src, tgt), rtol=0, atol=0)


@pytest.mark.parametrize("cast, name", [
    (torch.nn.Module.half, "torch.float16"),
    (torch.nn.Module.double, "torch.float64"),
    (lambda m: m.to(torch.float16), "torch.float16"),
    (lambda m: m.to("cpu", torch.float64), "torch.float64"),
])
def test_a_cast_to_another_float_dtype_raises_before_anything_changes(cast, name, tiny):
    model = tiny()
    config, params = model.config, impl_torch.params_of(model)
    with pytest.raises(ValueError, match=f"cannot cast the parameters to {name}"):
        cast(model)
    assert model.config == config and model.embedder.pe.dtype == torch.float32
    assert all(impl_torch.params_of(model)[n].tobytes() == a.tobytes() for n, a in params.items())


def test_moving_device_keeps_config_and_dtypes(ids):
    c = preset("tiny", param_dtype="float32")
    model = impl_torch.Transformer(c, seed=1).eval()
    src, tgt = ids(45, 1, 5), ids(46, 1, 4, bos=True)
    want = model(src, tgt)
    assert model.to("cpu") is model and model.cpu() is model and model.to(device=torch.device("cpu")) is model
    assert model.config == c and model.embedding.dtype == torch.float32 and model.embedder.pe.dtype == torch.float32
    torch.testing.assert_close(model(src, tgt), want, rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu(ids, tiny):
    cpu = tiny()
    gpu = impl_torch.from_params(cpu.config, impl_torch.params_of(cpu), device="cuda")
    moved = impl_torch.from_params(cpu.config, impl_torch.params_of(cpu)).to("cuda")
    assert moved.embedding.device.type == moved.embedder.pe.device.type == "cuda" and moved.config == cpu.config
    src, tgt = ids(15, 2, 6), ids(16, 2, 5, bos=True)
    with impl_torch.numerics_scope():
        for m in (gpu, moved):
            torch.testing.assert_close(m(src.cuda(), tgt.cuda()).cpu(), cpu(src, tgt), rtol=0, atol=TOL[torch.bfloat16])


@pytest.mark.parametrize("norm_first", [False, True])
def test_dropout_records_its_masks_and_the_values_it_adds(ids, tiny, norm_first):
    """With a generator, a forward with intermediates records ``spec.shapes.intermediates(..., dropout=True)``:
    a bool keep mask per dropout site and the site's value after dropout (zero where dropped); the logits are the
    float32 reference's replaying those masks."""
    m = tiny("float32", dropout=0.25, norm_first=norm_first)
    B, S, T = 2, 7, 6
    src, tgt = ids(43, B, S), ids(44, B, T, bos=True)
    with torch.no_grad():
        logits, inter = m(src, tgt, intermediates=True, rng=torch.Generator().manual_seed(5))
    assert sorted(inter) == sorted(shapes.intermediates(m.config, B, S, T, dropout=True))
    for site in shapes.dropout_sites(m.config):
        keep = inter[f"{site}.keep"]
        assert keep.dtype == torch.bool and keep.shape == inter[site].shape, site
        assert not inter[site][~keep].any() and not keep.all(), site
    masks = {k: v.numpy() for k, v in inter.items() if k.endswith(".keep")}
    want = ref.Transformer(ref.as_float64(impl_torch.params_of(m), m.config), m.config,
                           Numerics("float32")).forward(src.numpy(), tgt.numpy(), rng=masks)
    assert np.abs(logits.numpy() - want).max() < 1e-5 * np.sqrt((want ** 2).mean())
