"""The decoder-only language model: the forward against ``spec.reference.LanguageModel``, the KV cache, padding,
sampling and ``generate`` against ``spec.sampling`` token for token, next-token training against ``spec.backward``,
weights and train-state files, and the spec's errors."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import impl_tf
import spec
from spec import api, backward, sampling, shapes, validate
from spec import reference as ref
from spec.init import init_params
from spec.numerics import Numerics
from spec.search import forbid_special

F32 = spec.preset("lm_tiny", dtype="float32", param_dtype="float32")
# fp32 logits agree with the reference to ~1e-6 relative: a draw whose margins exceed this is decided alike.
MARGIN = 1e-5


@pytest.fixture(scope="module")
def params():
    """Observable fp32 weights whose EOS row is 1.1 x token 34's, so that rows end at EOS at several lengths."""
    p = init_params(F32, 0, observable=True)
    p["embedding"][F32.eos_id] = 1.1 * p["embedding"][34]
    return p


@pytest.fixture(scope="module")
def lm(params):
    return impl_tf.from_params(F32, params)


def _tokens(seed: int, B: int, T: int) -> np.ndarray:
    ids = np.random.default_rng(seed).integers(3, F32.vocab_size, (B, T))
    ids[:, 0] = F32.bos_id
    return ids


def _rel(got, want) -> float:
    """max |got - want| / max |want| (0 where both are 0)."""
    want, scale = np.asarray(want, np.float64), np.abs(np.asarray(want, np.float64)).max()
    return float(np.abs(np.asarray(got, np.float64) - want).max() / (scale or 1.0))


def test_api_conforms():
    assert api.check_api(impl_tf) == []


def test_forward_matches_the_reference_and_records_every_intermediate(lm, params):
    tokens = _tokens(0, 3, 9)
    tokens[1, 5:] = F32.pad_id
    logits, rec = lm(tokens, intermediates=True)
    want = shapes.intermediates(F32, 3, 0, 9)
    assert set(rec) | {"logits"} == set(want) and "src_embed" not in want
    for name, (shape, _) in want.items():
        assert tuple((logits if name == "logits" else rec[name]).shape) == shape, name
    faithful = ref.LanguageModel(ref.as_float64(params, F32), F32, Numerics("float32")).forward(tokens)
    assert logits.dtype == tf.float32 and _rel(logits, faithful) < 1e-5
    assert _rel(lm(tokens), logits) < 1e-6  # another program, fused otherwise: fp32 ulps apart


def test_bfloat16_forward_and_dropout():
    """bf16 close to the faithful bf16 reference (a loose bound; the conformance suite judges precisely); with a
    seed, every dropout site of the decoder-only model records its keep mask, and the reference replaying them
    agrees. ``generate`` runs in bf16 too, in the output form of the spec."""
    c = spec.preset("lm_tiny", dropout=0.25)
    p = init_params(c, 1, observable=True)
    model, tokens = impl_tf.LanguageModel(c, params=p), _tokens(1, 2, 7)
    faithful = ref.LanguageModel(ref.as_float64(p, c), c, Numerics("bfloat16"))
    assert np.abs(model(tokens).numpy() - faithful.forward(tokens)).max() < 0.05
    logits, rec = model(tokens, intermediates=True, rng=[5, 0])
    want = shapes.intermediates(c, 2, 0, 7, dropout=True)
    assert set(rec) | {"logits"} == set(want)
    masks = {name: rec[name].numpy() for name in want if name.endswith(".keep")}
    assert len(masks) == len(shapes.dropout_sites(c)) and rec["tgt_embed"].numpy().dtype == ml_dtypes.bfloat16
    assert np.abs(logits.numpy() - faithful.forward(tokens, rng=masks)).max() < 0.05
    new = impl_tf.generate(model, tokens[:, :3], 5, temperature=0.9, top_k=8).numpy()
    assert new.dtype == np.int64 and new.shape[0] == 2 and 1 <= new.shape[1] <= 5
    ends = [list(row).index(c.eos_id) + 1 if c.eos_id in row else len(row) for row in new]
    assert not (new == c.bos_id).any() and all((row[n:] == c.pad_id).all() for row, n in zip(new, ends, strict=True))


def test_cache_gives_the_forward_logits(lm):
    """A prefill then one token per call, or chunks, give the logits of the forward over the whole sequence."""
    tokens = _tokens(2, 2, 9)
    want = lm(tokens).numpy()
    for chunks in ([4, 1, 1, 1, 1, 1], [3, 2, 4]):
        cache, got = lm.init_cache(2, 9), []
        assert cache.memory_kv == () and cache.memory_mask is None and len(cache.self_kv) == F32.n_decoder_layers
        for start, n in zip(np.cumsum([0, *chunks]), chunks, strict=False):
            logits, cache = lm.decode(tokens[:, start:start + n], cache)
            got.append(logits.numpy())
        assert int(cache.length) == 9 and _rel(np.concatenate(got, axis=1), want) < 1e-5
    assert lm.compiled["decode"].experimental_get_tracing_count() == 1


def test_a_right_padded_row_gives_its_own_logits(lm):
    tokens = _tokens(3, 2, 8)
    tokens[0, 5:] = F32.pad_id
    got, alone = lm(tokens).numpy()[0, :5], lm(tokens[:1, :5]).numpy()[0]
    assert _rel(got, alone) < 1e-5


PROMPT = np.array([[1, 5, 9, 0, 0, 0, 0], [1, 7, 8, 9, 10, 11, 0], [1, 4, 0, 0, 0, 0, 0]])  # a spare pad column


@pytest.mark.parametrize("settings", [dict(temperature=0), dict(temperature=0.8, top_k=10, top_p=0.9, seed=3)])
def test_generate_matches_spec_sampling(lm, params, settings):
    """Three prompts of lengths 3, 6 and 2: greedy rows end at EOS after 6 and 4 tokens and at the limit, sampled
    rows after 6, 2 and 10 (the output trimmed to 10); every draw decided by more than ``MARGIN``."""
    trace = {}
    want = sampling.generate(ref.as_float64(params, F32), PROMPT, F32, Numerics("float32"), 12, trace=trace,
                             **settings)
    assert min(min(m.values()) for row in trace["rows"] for m in row) > MARGIN
    assert len({int((row == F32.eos_id).argmax()) for row in want}) == 3
    got = impl_tf.generate(lm, PROMPT, 12, **settings)
    assert got.dtype == tf.int64
    np.testing.assert_array_equal(got.numpy(), want)
    assert lm.compiled["generate"].experimental_get_tracing_count() == 1


SETTINGS = [(0.0, None, 1.0), (1.0, None, 1.0), (0.7, 5, 1.0), (1.3, None, 0.8), (0.9, 12, 0.5), (2.0, 1, 0.3),
            (0.6, 30, 0.95), (1.0, 61, 0.999)]


def _decided(margins: dict[str, float]) -> bool:
    """A draw both sides decide alike: every margin over ``MARGIN``, or an exact tie of logits (a zero argmax or
    top-k margin), which the tie rule decides."""
    return all(m > MARGIN or (m == 0 and k in ("argmax_margin", "top_k_margin")) for k, m in margins.items())


def test_sample_matches_spec_sample_on_ties():
    """Logits in steps of 0.5 (ties everywhere), pad and BOS at -inf, compiled as ``generate`` runs it (the settings
    are the program's tensors): the spec's token wherever its trace decides (``_decided``), exact ties included."""
    rng = np.random.default_rng(4)
    logits = np.round(rng.normal(0, 2, (64, F32.vocab_size)) * 2) / 2
    logits = forbid_special(logits, F32).astype(np.float32)
    u = rng.random(64)
    program = tf.function(impl_tf.sampling.sample, jit_compile=True)
    decided = ties = 0
    for temperature, top_k, top_p in SETTINGS:
        trace = {}
        want = sampling.sample(logits, u, temperature, top_k, top_p, Numerics("float32"), trace)
        got = program(logits, tf.constant(u, tf.float32), tf.constant(temperature, tf.float32),
                      tf.constant(F32.vocab_size if top_k is None else top_k), tf.constant(top_p, tf.float32))
        sure = np.array([_decided(m) for m in trace["rows"]])
        np.testing.assert_array_equal(got.numpy()[sure], want[sure])
        decided += sure.sum()
        ties += sum(m.get("argmax_margin", m.get("top_k_margin")) == 0 for m in trace["rows"])
    assert decided > 0.9 * 64 * len(SETTINGS) and ties > 20
    eager = impl_tf.sampling.sample(logits, u, 0.9, 12, 0.5).numpy()          # Python numbers, eagerly
    np.testing.assert_array_equal(eager, program(logits, tf.constant(u, tf.float32), 0.9, 12, 0.5).numpy())


def test_lm_loss_and_gradients_match_spec_backward(lm, params):
    tokens = _tokens(5, 3, 8)
    tokens[2, 4:] = F32.pad_id
    loss, grads = impl_tf.lm_loss_and_gradients(lm, tokens, 0.1)
    want_loss, want = backward.lm_loss_and_gradients(params, tokens, F32, 0.1, Numerics("exact"))
    assert list(grads) == list(want)
    assert abs(float(loss) - want_loss) <= 1e-4 * abs(want_loss)
    for name, g in grads.items():
        assert g.dtype == tf.float32 and _rel(g, want[name]) < 1e-4, name


def test_lm_train_steps_and_the_train_state_file(params, tmp_path):
    model = impl_tf.from_params(F32.replace(dropout=0.1), params)
    state = impl_tf.init_train_state(model, seed=1)
    before = impl_tf.params_of(model)
    for seed in (6, 7):
        loss, model, state = impl_tf.lm_train_step(model, state, _tokens(seed, 2, 8))
        assert np.isfinite(float(loss))
    after = impl_tf.params_of(model)
    assert int(state.step) == 2
    assert not np.array_equal(after["decoder.layers.0.ffn.w_1"], before["decoder.layers.0.ffn.w_1"])
    impl_tf.save_train_state(state, tmp_path / "state.safetensors")
    loaded = impl_tf.load_train_state(tmp_path / "state.safetensors", model)
    assert int(loaded.step) == 2 and list(loaded.m) == list(model.params)
    for name in model.params:
        np.testing.assert_array_equal(loaded.m[name].numpy(), state.m[name].numpy())
        np.testing.assert_array_equal(loaded.v[name].numpy(), state.v[name].numpy())
    np.testing.assert_array_equal(loaded.rng.state.numpy(), state.rng.state.numpy())


def test_weights_round_trip_as_a_language_model(lm, params, tmp_path):
    impl_tf.save_weights(lm, tmp_path / "lm.safetensors")
    loaded = impl_tf.load_weights(tmp_path / "lm.safetensors")
    assert isinstance(loaded, impl_tf.LanguageModel) and loaded.config == F32
    for name, a in impl_tf.params_of(loaded).items():
        assert a.tobytes() == params[name].tobytes(), name
    assert isinstance(impl_tf.from_params(F32, params), impl_tf.LanguageModel)


def _message(call) -> str:
    with pytest.raises(ValueError) as e:
        call()
    return str(e.value)


def test_model_kind_and_cache_errors_are_the_specs(lm):
    tiny = spec.preset("tiny")
    assert _message(lambda: impl_tf.Transformer(F32)) == _message(lambda: validate.check_model_kind(F32, False))
    assert _message(lambda: impl_tf.LanguageModel(tiny)) == _message(lambda: validate.check_model_kind(tiny, True))
    assert _message(lambda: lm.init_cache(0, 4)) == _message(lambda: validate.check_cache_size(0, 4, F32))
    assert _message(lambda: impl_tf.lm_loss_and_gradients(lm, [[1]])) == _message(
        lambda: validate.check_lm_batch(np.array([[1]]), F32))


EMPTY_ROW = np.where(np.arange(3)[:, None] == 2, F32.pad_id, PROMPT)


@pytest.mark.parametrize("prompt, n, settings", [
    (EMPTY_ROW, 4, {}), (PROMPT, F32.max_len - 5, {}), (PROMPT, 4, dict(temperature=-1)), (PROMPT, 4, dict(top_p=0)),
    (PROMPT, 4, dict(top_p=1.5)), (PROMPT, 4, dict(top_k=0)), (PROMPT, 4, dict(temperature=math.nan))])
def test_generate_errors_are_the_specs(lm, prompt, n, settings):
    def spec_checks():
        validate.check_prompt(prompt, F32, n)
        sampling.check_sampling(settings.get("temperature", 1.0), settings.get("top_k"), settings.get("top_p", 1.0), 0)

    assert _message(lambda: impl_tf.generate(lm, prompt, n, **settings)) == _message(spec_checks)
