"""The decoder-only model: forward against the NumPy reference, the KV cache, padding, next-token training against
``spec.backward``, weights and train state I/O, errors (sampling and ``generate``: ``test_sampling.py``)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

import impl_torch
import spec.api
from spec import backward, preset, shapes, validate
from spec import reference as ref
from spec.golden_cases import make_params
from spec.numerics import Numerics
from spec.schema import param_specs

F32 = preset("lm_tiny", dtype="float32", param_dtype="float32")


def _params(c=F32, seed=5, **kw):
    return make_params(c, seed, **kw)


def _model(c=F32, seed=5, **kw):
    return impl_torch.from_params(c, _params(c, seed, **kw))


def _tokens(seed: int, B: int, T: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, F32.vocab_size, (B, T))


def _rel(got: torch.Tensor, want: np.ndarray) -> float:
    """max |got - want| / max |want|."""
    return float(np.abs(got.detach().cpu().numpy().astype(np.float64) - want).max() / np.abs(want).max())


def _spec_error(f, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as e:
        f(*args, **kwargs)
    return str(e.value)


def test_exports_the_common_api():
    assert spec.api.check_api(impl_torch) == []
    assert impl_torch.lm.LanguageModel is impl_torch.LanguageModel
    assert impl_torch.sampling.generate is impl_torch.generate


def test_parameters_are_the_schema_and_the_seed_gives_spec_init_params():
    c = preset("lm_tiny")
    model = impl_torch.LanguageModel(c, seed=3)
    want = spec.init_params(c, 3)
    got = impl_torch.params_of(model)
    assert list(got) == [s.name for s in param_specs(c)] == list(want)
    for name, a in want.items():
        assert got[name].dtype == a.dtype and np.array_equal(got[name].view(np.uint16), a.view(np.uint16)), name
    assert not any(name.startswith("encoder.") or "cross_attn" in name for name in got)
    assert all(layer.cross_attn is None and layer.cross_attn_norm is None for layer in model.decoder.layers)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_forward_is_the_reference(dtype):
    c = preset("lm_tiny", dtype=dtype, param_dtype=dtype)
    params, tokens = _params(c), _tokens(0, 3, 11)
    tokens[2, 7:] = c.pad_id
    logits, inter = _model(c)(tokens, intermediates=True)
    want = ref.LanguageModel(ref.as_float64(params, c), c, Numerics(dtype)).forward(tokens)
    assert logits.dtype == torch.float32 and logits.shape == (3, 11, c.vocab_size)
    assert _rel(logits, want) < (1e-5 if dtype == "float32" else 3e-2)
    assert sorted(inter) == sorted(shapes.intermediates(c, 3, 0, 11)) and inter["logits"] is logits
    for name, (shape, dt) in shapes.intermediates(c, 3, 0, 11).items():
        assert tuple(inter[name].shape) == shape and inter[name].dtype == impl_torch.layers.DTYPES.get(dt), name


def test_dropout_only_with_an_rng_and_its_keep_masks_are_recorded():
    model, tokens = _model(preset("lm_tiny")), _tokens(1, 2, 6)
    torch.testing.assert_close(model(tokens), model.train()(tokens), rtol=0, atol=0)  # no rng: evaluation
    rng = torch.Generator().manual_seed(0)
    logits, inter = model(tokens, intermediates=True, rng=rng)
    want = shapes.intermediates(model.config, 2, 0, 6, dropout=True)
    assert sorted(inter) == sorted(want)
    keep = inter["decoder.layers.0.ffn.keep"]
    assert keep.dtype == torch.bool and 0.8 < keep.float().mean() < 0.98
    assert not torch.equal(logits, model(tokens))


@pytest.mark.parametrize("chunks", [[9], [1] * 9, [4, 1, 1, 3], [2, 5, 2]])
def test_the_cache_gives_the_forward_logits(chunks):
    """A prefill and then one token per call, or any chunks, give the logits of the whole forward."""
    model, tokens = _model(), _tokens(2, 2, 9)
    full = model(tokens).detach()
    cache, start, got = model.init_cache(2, 12), 0, []
    for n in chunks:
        logits, cache = model.decode(tokens[:, start:start + n], cache)
        got.append(logits.detach())
        start += n
    assert cache.length == 9 and cache.memory_kv == [] and cache.memory_mask is None
    assert tuple(f.name for f in dataclasses.fields(cache)) == spec.api.KV_CACHE_FIELDS
    assert _rel(torch.cat(got, dim=1), full.numpy()) < 1e-5


def test_a_consumed_cache_is_refused():
    model = _model()
    cache = model.init_cache(1, 4)
    _, after = model.decode([[1, 5]], cache)
    with pytest.raises(ValueError, match="consumed"):
        model.decode([[7]], cache)
    assert model.decode([[7]], after)[1].length == 3


def test_a_right_padded_row_gives_its_logits_alone():
    model, tokens = _model(), _tokens(3, 3, 8)
    tokens[1, 5:] = F32.pad_id
    batch = model(tokens).detach()
    alone = model(tokens[1:2, :5]).detach()
    assert torch.isfinite(batch).all()
    assert _rel(batch[1:2, :5], alone.numpy()) < 1e-5


def test_lm_loss_and_gradients_are_spec_backward():
    params, tokens = _params(), _tokens(5, 3, 10)
    tokens[1, 6:] = F32.pad_id
    loss, grads = impl_torch.lm_loss_and_gradients(_model(), tokens, 0.1)
    want_loss, want = backward.lm_loss_and_gradients(params, tokens, F32, 0.1, Numerics("exact"))
    assert loss.dtype == torch.float32 and abs(float(loss) - want_loss) <= 1e-5 * abs(want_loss)
    assert list(grads) == list(want)
    for name, g in grads.items():
        assert g.dtype == torch.float32 and g.shape == want[name].shape, name
        scale = np.abs(want[name]).max()
        assert (_rel(g, want[name]) if scale else float(g.abs().max())) < 1e-4, name


def test_lm_train_steps_change_the_weights_and_the_train_state_round_trips(tmp_path):
    c = preset("lm_tiny", param_dtype="float32")
    model, tokens = _model(c), _tokens(6, 4, 9)
    before = {k: v.copy() for k, v in impl_torch.params_of(model).items()}
    state = impl_torch.init_train_state(model, seed=1)
    losses = []
    for _ in range(2):
        loss, model, state = impl_torch.lm_train_step(model, state, tokens)
        losses.append(float(loss))
    assert state.step == 2 and all(math.isfinite(x) for x in losses)
    after = impl_torch.params_of(model)
    assert not np.array_equal(after["decoder.layers.0.ffn.w_1"], before["decoder.layers.0.ffn.w_1"])
    assert not np.array_equal(after["embedding"], before["embedding"])
    impl_torch.save_train_state(state, tmp_path / "state.safetensors")
    loaded = impl_torch.load_train_state(tmp_path / "state.safetensors", model)
    assert loaded.step == 2 and loaded.train_config == state.train_config
    assert torch.equal(loaded.rng.get_state(), state.rng.get_state())
    for k in ("m", "v"):
        for name, t in getattr(state, k).items():
            assert torch.equal(getattr(loaded, k)[name], t), (k, name)


def test_weights_round_trip_as_a_language_model(tmp_path):
    model = impl_torch.LanguageModel(preset("lm_tiny"), seed=2)
    impl_torch.save_weights(model, tmp_path / "lm.safetensors")
    loaded = impl_torch.load_weights(tmp_path / "lm.safetensors")
    assert isinstance(loaded, impl_torch.LanguageModel) and not loaded.training
    assert loaded.config == model.config
    for name, a in impl_torch.params_of(model).items():
        assert np.array_equal(impl_torch.params_of(loaded)[name].view(np.uint16), a.view(np.uint16)), name
    assert isinstance(impl_torch.from_params(spec.TINY, spec.init_params(spec.TINY, 0)), impl_torch.Transformer)


def test_casts_keep_the_config_true():
    model = impl_torch.LanguageModel(preset("lm_tiny"), seed=0).float()
    assert model.config.param_dtype == "float32" and model.embedding.dtype == torch.float32
    assert model.embedder.pe.dtype == torch.float32


def test_the_model_kind_is_checked():
    lm, ed = preset("lm_tiny"), spec.TINY
    assert str(pytest.raises(ValueError, impl_torch.Transformer, lm).value) == \
        _spec_error(validate.check_model_kind, lm, decoder_only=False)
    assert str(pytest.raises(ValueError, impl_torch.LanguageModel, ed).value) == \
        _spec_error(validate.check_model_kind, ed, decoder_only=True)


def test_bad_tokens_and_cache_sizes_raise_the_spec_error():
    model = _model()
    assert _spec_error(model, [[1, 99]]) == _spec_error(validate.check_tokens, "tokens", np.array([[1, 99]]), F32)
    assert _spec_error(model.init_cache, 0, 4) == _spec_error(validate.check_cache_size, 0, 4, F32)
    assert _spec_error(model.init_cache, 1, 65) == _spec_error(validate.check_cache_size, 1, 65, F32)
    assert "capacity" in _spec_error(model.decode, [[1, 2, 3]], model.init_cache(1, 2))
    assert _spec_error(impl_torch.lm_loss_and_gradients, model, [[1]]) == \
        _spec_error(validate.check_lm_batch, np.array([[1]]), F32)
    assert "every target is pad_id" in _spec_error(impl_torch.lm_train_step, model,
                                                   impl_torch.init_train_state(model), [[5, 0, 0]])


def test_type_hints_resolve():
    import typing

    for f in (impl_torch.generate, impl_torch.sampling.sample, impl_torch.lm_loss_and_gradients,
              impl_torch.lm_train_step, impl_torch.LanguageModel.forward, impl_torch.LanguageModel.init_cache,
              impl_torch.LanguageModel.decode):
        assert typing.get_type_hints(f)["return"] is not None, f
