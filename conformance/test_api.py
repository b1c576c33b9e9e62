"""The common public API of ``spec.api``, asked of each impl module directly (not through its adapter).

The reference backend is the spec itself, not a library with this API: the plugin does not collect this file
for it.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import spec
from spec import api
from spec.config import TINY
from spec.training import TrainConfig

CONFIG = TINY.replace(d_ff=40)
SRC = [[5, 9, 17, 2], [7, 3, 2, 0]]  # (B, S) = (2, 4), the second row padded


@pytest.fixture(scope="module")
def impl(backend):
    return backend.module


def _np(x) -> np.ndarray:
    """A framework array (on any device) as NumPy, for comparing values."""
    return np.asarray(x.cpu() if hasattr(x, "cpu") else x)


def test_api_names_and_signatures(impl):
    assert api.check_api(impl) == []


def test_api_seed_gives_spec_weights(impl):
    model = impl.Transformer(CONFIG, seed=3)
    assert model.config == CONFIG
    want, got = spec.init_params(CONFIG, 3), impl.params_of(model)
    assert list(got) == list(want)
    bad = [n for n in want if got[n].dtype != want[n].dtype or got[n].tobytes() != want[n].tobytes()]
    assert not bad, f"not bit-identical to spec.init_params: {bad[:3]}"


def test_api_entry_points_types(impl):
    model = impl.Transformer(CONFIG)
    logits = model(SRC, [[1, 7, 8], [1, 4, 4]])
    assert tuple(logits.shape) == (2, 3, CONFIG.vocab_size) and "float32" in str(logits.dtype)
    cache = model.init_cache(model.encode(SRC), SRC, capacity=3)
    assert isinstance(cache, impl.KVCache) and tuple(type(cache).__dataclass_fields__ if hasattr(
        type(cache), "__dataclass_fields__") else cache._fields) == api.KV_CACHE_FIELDS
    step, cache = model.decode([[1], [1]], cache)
    assert tuple(step.shape) == (2, 1, CONFIG.vocab_size) and "float32" in str(step.dtype)
    assert int(cache.length) == 1
    for tokens in (impl.greedy_search(model, SRC, max_new_tokens=4), impl.beam_search(model, SRC, max_new_tokens=4)):
        assert "int64" in str(tokens.dtype) and tokens.shape[0] == 2


def test_api_load_weights_config_rule(impl, tmp_path):
    path = tmp_path / "model.safetensors"
    impl.save_weights(impl.Transformer(CONFIG, seed=2), path)
    assert impl.load_weights(path).config == CONFIG
    other = CONFIG.replace(max_len=32, dropout=0.0)
    with pytest.warns(UserWarning, match="max_len 64 -> 32, dropout 0.1 -> 0.0"):
        assert impl.load_weights(path, other).config == other
    with pytest.raises(ValueError, match="the given config has d_ff=48 but the weights were stored with d_ff=40"):
        impl.load_weights(path, CONFIG.replace(d_ff=48))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        impl.load_weights(path, CONFIG)  # the stored config itself: nothing to state


def test_api_from_params_checks(impl):
    with pytest.raises(ValueError, match=r"parameter 'embedding': expected shape \(61, 64\), got \(61, 32\)"):
        impl.from_params(CONFIG.replace(d_model=64), spec.init_params(CONFIG, 0))


TGT_IN, TGT_OUT = [[1, 7, 8], [1, 4, 0]], [[7, 8, 2], [4, 2, 0]]  # (B, T); the second row's last target is pad
TRAIN = TrainConfig(warmup_steps=10)


def _scalar(x) -> float:
    assert "float32" in str(x.dtype) and tuple(x.shape) == (), f"loss {x!r} is not a float32 scalar"
    return float(_np(x))


def test_api_evaluation_never_drops_out(impl):
    """Dropout 0.5 in the config (section 5.4), whatever the model's mode: the searches give the same tokens on every
    call, and ``loss_and_gradients`` the same loss and gradients, bit for bit, as the same weights with dropout 0."""
    model = impl.Transformer(CONFIG.replace(dropout=0.5), seed=1)
    a, b = (_np(impl.greedy_search(model, SRC, max_new_tokens=6)) for _ in range(2))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(_np(impl.beam_search(model, SRC, max_new_tokens=6)),
                                  _np(impl.beam_search(model, SRC, max_new_tokens=6)))
    plain = impl.from_params(CONFIG.replace(dropout=0.0), impl.params_of(model))
    (loss, grads), (loss0, grads0) = (impl.loss_and_gradients(m, SRC, TGT_IN, TGT_OUT) for m in (model, plain))
    assert _scalar(loss) == _scalar(loss0)
    assert [k for k in grads0 if not np.array_equal(_np(grads[k]), _np(grads0[k]))] == []


def test_api_train_step(impl):
    """train_step: (loss before the update, model, state); step and config kept; the loss is loss_and_gradients'."""
    model = impl.Transformer(CONFIG.replace(dropout=0.0), seed=4)
    before = {k: v.copy() for k, v in impl.params_of(model).items()}
    want, grads = impl.loss_and_gradients(model, SRC, TGT_IN, TGT_OUT, label_smoothing=TRAIN.label_smoothing)
    assert list(grads) == list(before) and all("float32" in str(g.dtype) for g in grads.values())
    state = impl.init_train_state(model, TRAIN, seed=0)
    assert isinstance(state, impl.TrainState) and state.step == 0 and state.train_config == TRAIN
    loss, model, state = impl.train_step(model, state, SRC, TGT_IN, TGT_OUT)
    assert _scalar(loss) == pytest.approx(_scalar(want), rel=1e-6) and int(state.step) == 1
    after = impl.params_of(model)
    assert all(not np.array_equal(after[k], before[k]) for k in ("embedding", "encoder.layers.0.ffn.w_1"))


def test_api_train_state_save_and_load(impl, tmp_path):
    """Going on from a saved and loaded state gives the same weights, bit for bit, as going on from the state."""
    model = impl.Transformer(CONFIG, seed=5)  # dropout 0.1: the RNG state matters too
    state = impl.init_train_state(model, TRAIN, seed=7)
    _, model, state = impl.train_step(model, state, SRC, TGT_IN, TGT_OUT)
    impl.save_train_state(state, tmp_path / "state.safetensors")
    impl.save_weights(model, tmp_path / "model.safetensors")
    loaded_model = impl.load_weights(tmp_path / "model.safetensors")
    loaded = impl.load_train_state(tmp_path / "state.safetensors", loaded_model)
    assert int(loaded.step) == 1 and loaded.train_config == TRAIN
    _, model, state = impl.train_step(model, state, SRC, TGT_IN, TGT_OUT)
    _, loaded_model, loaded = impl.train_step(loaded_model, loaded, SRC, TGT_IN, TGT_OUT)
    a, b = impl.params_of(model), impl.params_of(loaded_model)
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)


def test_api_train_rejects_bad_batches(impl):
    model = impl.Transformer(CONFIG)
    state = impl.init_train_state(model)
    with pytest.raises(ValueError, match=r"tgt_out: shape \(2, 2\) differs from tgt_in's \(2, 3\)"):
        impl.train_step(model, state, SRC, TGT_IN, [[7, 8], [4, 2]])
    with pytest.raises(ValueError, match="every target is pad_id"):
        impl.loss_and_gradients(model, SRC, TGT_IN, [[0, 0, 0], [0, 0, 0]])
    with pytest.raises(ValueError, match="seed"):
        impl.init_train_state(model, seed=-1)
