"""The decoder-only language model: forward against the reference, the KV cache, padding, ``sample`` and ``generate``
against ``spec.sampling``, gradients against ``spec.backward``, training, files, and bad input."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

import impl_jax
import spec
import spec.api
from impl_jax import sampling as S
from spec import backward, shapes, validate
from spec import reference as ref
from spec import sampling as spec_sampling
from spec.init import init_params
from spec.numerics import Numerics, np_dtype
from spec.schema import param_specs
from spec.search import forbid_special

F32 = spec.preset("lm_tiny", dtype="float32", param_dtype="float32")
PROMPT = np.array([[1, 5, 9, 11, 0, 0], [1, 7, 0, 0, 0, 0], [1, 3, 4, 5, 6, 8]])   # lengths 4, 2, 6


@pytest.fixture(scope="module")
def lm():
    """lm_tiny in float32, seed 0."""
    return impl_jax.LanguageModel(F32, 0)


def _ids(seed: int, B: int, T: int) -> np.ndarray:
    ids = np.random.default_rng(seed).integers(3, F32.vocab_size, (B, T))
    ids[:, 0] = F32.bos_id
    return ids


def _eos_boosted(boost: float) -> dict[str, np.ndarray]:
    """lm_tiny's fp32 weights with ``boost`` added to every EOS logit (the final norm's bias moved along EOS's
    embedding), so that rows end at different steps."""
    params = init_params(F32, 0)
    e = params["embedding"][F32.eos_id].astype(np.float64)
    params["decoder.final_norm.bias"] = (params["decoder.final_norm.bias"] + boost * e / (e @ e)).astype(np.float32)
    return params


def test_the_api_conforms_to_the_spec():
    assert spec.api.check_api(impl_jax) == []


def test_forward_matches_the_reference_and_records_the_spec_intermediates(lm):
    ids = _ids(1, 2, 9)
    ids[1, 6:] = F32.pad_id
    logits, rec = lm(ids, intermediates=True)
    want = ref.LanguageModel(ref.as_float64(init_params(F32, 0), F32), F32, Numerics("float32")).forward(ids)
    assert logits.shape == (2, 9, F32.vocab_size) and logits.dtype == np.float32
    assert np.abs(np.asarray(logits) - want).max() <= 1e-5 * np.abs(want).max()
    names = shapes.intermediates(F32, 2, 0, 9)
    assert sorted(rec) == sorted(names)
    for name, (shape, dtype) in names.items():
        assert rec[name].shape == shape and np.dtype(rec[name].dtype) == np_dtype(dtype), name
    _, dropped = lm(ids, intermediates=True, rng=jax.random.key(0))
    assert sorted(dropped) == sorted(shapes.intermediates(F32, 2, 0, 9, dropout=True))
    assert not np.asarray(dropped["tgt_embed.keep"]).all()


def test_bfloat16_forward_is_close_to_the_reference():
    c = spec.preset("lm_tiny")
    ids = _ids(2, 2, 9)
    logits = np.asarray(impl_jax.LanguageModel(c, 0)(ids))
    want = ref.LanguageModel(ref.as_float64(init_params(c, 0), c), c, Numerics("bfloat16")).forward(ids)
    assert np.abs(logits - want).max() <= 0.05 * np.abs(want).max()


def test_the_cache_gives_the_forwards_logits_one_token_at_a_time_and_in_chunks(lm):
    ids = _ids(3, 2, 9)
    full = np.asarray(lm(ids))
    for chunks in ((4, 1, 1, 1, 1, 1), (4, 4, 1)):
        cache, steps, at = lm.init_cache(2, 9), [], 0
        assert cache.memory_kv == () and cache.memory_mask is None
        for n in chunks:
            logits, cache = lm.decode(ids[:, at:at + n], cache)
            steps.append(np.asarray(logits))
            at += n
        assert int(cache.length) == 9
        np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-5, atol=1e-5 * np.abs(full).max())


def test_a_right_padded_row_has_its_own_logits(lm):
    ids = _ids(4, 2, 9)
    ids[1, 6:] = F32.pad_id
    alone = np.asarray(lm(ids[1:, :6]))
    np.testing.assert_allclose(np.asarray(lm(ids))[1, :6], alone[0], rtol=1e-5, atol=1e-5 * np.abs(alone).max())


@pytest.mark.parametrize("boost, kwargs", [
    (4.0, {"temperature": 0.0}),                                          # rows of 1, 10 and 1 tokens
    (2.0, {"temperature": 0.8, "top_k": 10, "top_p": 0.9, "seed": 3}),    # 10, 1, 4
    (3.0, {"temperature": 0.8, "top_k": 10, "top_p": 0.9, "seed": 3}),    # all end early: 4, 1, 4
    (0.0, {"temperature": 1.0, "seed": 1}),                               # no cut
], ids=["greedy", "sampled", "sampled_all_end_early", "plain"])
def test_generate_draws_the_tokens_of_the_spec(boost, kwargs):
    params = _eos_boosted(boost)
    got = impl_jax.generate(impl_jax.from_params(F32, params), PROMPT, 10, **kwargs)
    trace = {}
    want = spec_sampling.generate(ref.as_float64(params, F32), PROMPT, F32, Numerics("float32"), 10, **kwargs,
                                  trace=trace)
    margins = [min(m.values()) for row in trace["rows"] for m in row]
    assert min(margins) > 1e-5                                            # decisive: backends must agree
    assert isinstance(got, np.ndarray) and got.dtype == np.int64
    np.testing.assert_array_equal(got, want)


def test_generate_compiles_once_per_bucket_and_logs_it(lm, compiles):
    """Batch bucket 4, prompt bucket 8, capacity 16: one program whatever the prompts' lengths, the sampling
    arguments and max_new_tokens (none if an earlier test compiled it)."""
    impl_jax.generate(lm, PROMPT, 10, temperature=0.0)
    impl_jax.generate(lm, [[1, 5, 0], [1, 7, 8], [1, 3, 4]], 12, temperature=0.5, top_k=3, top_p=0.5, seed=9)
    impl_jax.generate(lm, PROMPT[:, :4], 9)
    assert compiles() in ([], ["impl_jax: compiling generate for batch 4, prompt length 8 (buckets); capacity 16"])


@pytest.mark.parametrize("temperature, top_k, top_p", [
    (0.0, None, 1.0), (1.0, None, 1.0), (0.8, 10, 0.9), (0.5, 3, 1.0), (1.3, None, 0.5), (2.0, 1, 0.3),
    (1.0, 61, 0.999),
])
def test_sample_draws_as_the_spec_with_ties(temperature, top_k, top_p):
    """Logits on a grid of 0.5 tie often, at the argmax and at the top-k cut: a margin of exactly 0 there is a tie
    that the order decides (the lower id first) in both, not a rounding, so it counts as decisive."""
    rng = np.random.default_rng(7)
    logits = forbid_special(np.round(rng.normal(0.0, 2.0, (256, F32.vocab_size)) * 2) / 2, F32).astype(np.float32)
    u = spec_sampling.uniforms(11, 256, 1)[:, 0]
    got = np.asarray(S.sample(logits, u.astype(np.float32), temperature, top_k, top_p))
    trace = {}
    want = spec_sampling.sample(logits, u, temperature, top_k, top_p, Numerics("float32"), trace)
    ties = ("argmax_margin", "top_k_margin")
    decisive = np.array([all(m > 1e-5 or (m == 0 and name in ties) for name, m in row.items())
                         for row in trace["rows"]])
    assert decisive.mean() > 0.9
    np.testing.assert_array_equal(got[decisive], want[decisive])


def test_lm_loss_and_gradients_match_spec_backward(lm):
    ids = _ids(5, 3, 8)
    ids[2, 5:] = F32.pad_id
    loss, grads = impl_jax.lm_loss_and_gradients(lm, ids, 0.1)
    want_loss, want = backward.lm_loss_and_gradients(impl_jax.params_of(lm), ids, F32, 0.1, Numerics("exact"))
    assert math.isclose(float(loss), want_loss, rel_tol=1e-5)
    assert list(grads) == list(want)
    for name, g in want.items():
        assert np.abs(np.asarray(grads[name]) - g).max() <= 1e-4 * np.abs(g).max(), name


@pytest.fixture(scope="module")
def trained(lm):
    """lm after two ``lm_train_step``s on one batch: (losses, model, state)."""
    ids = _ids(6, 3, 8)
    state = impl_jax.init_train_state(lm)
    loss, model, state = impl_jax.lm_train_step(lm, state, ids)
    loss2, model, state = impl_jax.lm_train_step(model, state, ids)
    return (loss, loss2), model, state


def test_training_steps_change_the_weights(lm, trained):
    losses, model, state = trained
    assert isinstance(model, impl_jax.LanguageModel) and int(state.step) == 2 and np.isfinite(losses).all()
    before, after = impl_jax.params_of(lm), impl_jax.params_of(model)
    assert list(after) == [s.name for s in param_specs(F32) if s.name in after]
    assert all((before[n] != after[n]).any() for n in before)


def test_weights_and_train_state_files_round_trip(trained, tmp_path):
    _, model, state = trained
    impl_jax.save_train_state(state, tmp_path / "state.safetensors")
    loaded = impl_jax.load_train_state(tmp_path / "state.safetensors", model)
    assert int(loaded.step) == 2 and loaded.train_config == state.train_config
    for k in ("m", "v"):
        assert list(getattr(loaded, k)) == list(getattr(state, k))
        assert all((np.asarray(getattr(loaded, k)[n]) == np.asarray(getattr(state, k)[n])).all() for n in state.m)
    assert (np.asarray(jax.random.key_data(loaded.rng)) == np.asarray(jax.random.key_data(state.rng))).all()
    impl_jax.save_weights(model, tmp_path / "lm.safetensors")
    again, params = impl_jax.load_weights(tmp_path / "lm.safetensors"), impl_jax.params_of(model)
    assert isinstance(again, impl_jax.LanguageModel)
    assert all((impl_jax.params_of(again)[n] == params[n]).all() for n in params)
    assert isinstance(impl_jax.from_params(F32, params), impl_jax.LanguageModel)


def _message(call) -> str:
    with pytest.raises(ValueError) as err:
        call()
    return str(err.value)


@pytest.mark.parametrize("prompt, max_new, kwargs", [
    ([[1, 5], [0, 0]], 4, {}),
    (PROMPT, F32.max_len - 5, {}),
    (PROMPT, 4, {"temperature": -1.0}),
    (PROMPT, 4, {"top_p": 0.0}),
    (PROMPT, 4, {"top_p": 1.5}),
    (PROMPT, 4, {"top_k": 0}),
    (PROMPT, 4, {"temperature": float("nan")}),
], ids=["empty_row", "too_long", "negative_temperature", "top_p_0", "top_p_1.5", "top_k_0", "nan_temperature"])
def test_generate_raises_the_specs_errors_before_computing(lm, prompt, max_new, kwargs, compiles):
    if kwargs:
        want = _message(lambda: spec_sampling.check_sampling(**({"temperature": 1.0, "top_k": None, "top_p": 1.0,
                                                                   "seed": 0} | kwargs)))
    else:
        want = _message(lambda: validate.check_prompt(np.asarray(prompt), F32, max_new))
    assert _message(lambda: impl_jax.generate(lm, prompt, max_new, **kwargs)) == want
    assert compiles() == []


def test_each_model_refuses_the_other_kind_of_config(lm):
    tiny = spec.preset("tiny")
    assert _message(lambda: impl_jax.Transformer(F32)) == _message(
        lambda: validate.check_model_kind(F32, decoder_only=False))
    assert _message(lambda: impl_jax.LanguageModel(tiny)) == _message(
        lambda: validate.check_model_kind(tiny, decoder_only=True))
    with pytest.raises(ValueError, match="batch must be an int >= 1"):
        lm.init_cache(0, 8)
