"""The common public API of ``spec.api``, asked of each impl module directly (not through its adapter).

The reference backend is the spec itself, not a library with this API: conftest does not collect this file
for it.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import spec
from spec import api
from spec.config import TINY

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


def test_api_search_is_evaluation(impl):
    """Dropout on in the config: search gives the same tokens on every call, whatever the model's mode."""
    model = impl.Transformer(CONFIG.replace(dropout=0.5), seed=1)
    a, b = (_np(impl.greedy_search(model, SRC, max_new_tokens=6)) for _ in range(2))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(_np(impl.beam_search(model, SRC, max_new_tokens=6)),
                                  _np(impl.beam_search(model, SRC, max_new_tokens=6)))


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
