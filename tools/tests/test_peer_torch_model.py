"""The stock peer (``tools.peer_torch``), its model: the forward against a NumPy float64 reading of the same
weights, weights round trips, the common API's signatures, input checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import spec
from spec import api
from tools import peer_torch as P
from tools.peer_torch import model as peer_model
from tools.tests.peer_torch_cases import CONFIG, batch, reference_logits


def test_bf16_runs_under_autocast_only_where_the_cpu_has_bf16_dot_products(monkeypatch):
    # Emulated (AVX2 alone), autocast's bf16 products cost many times fp32's: the peer keeps its faster setting.
    src, tgt_in, _ = batch(CONFIG, np.random.default_rng(1))
    want = P.Transformer(CONFIG, seed=3).eval()(src, tgt_in).detach()
    bf16 = P.Transformer(CONFIG.replace(dtype="bfloat16", param_dtype="bfloat16"), seed=3).eval()
    monkeypatch.setattr(peer_model, "native_bf16", lambda: False)
    assert torch.equal(bf16(src, tgt_in).detach(), want)
    monkeypatch.setattr(peer_model, "native_bf16", lambda: True)
    assert not torch.equal(bf16(src, tgt_in).detach(), want)


def test_forward_equals_a_float64_reading_of_the_weights():
    src, tgt_in, _ = batch(CONFIG, np.random.default_rng(1))
    model = P.Transformer(CONFIG, seed=3).eval()
    got = model(src, tgt_in).detach().numpy()
    assert got.dtype == np.float32 and got.shape == (*tgt_in.shape, CONFIG.vocab_size)
    want = reference_logits(CONFIG, P.params_of(model), src, tgt_in)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_weights_round_trip_bit_for_bit(tmp_path):
    src, tgt_in, tgt_out = batch(CONFIG, np.random.default_rng(6))
    model = P.Transformer(CONFIG, seed=0)
    P.train_step(model, P.init_train_state(model), src, tgt_in, tgt_out)
    P.save_weights(model, tmp_path / "w.safetensors")
    loaded = P.load_weights(tmp_path / "w.safetensors")
    assert loaded.config == CONFIG and not loaded.training
    a, b = P.params_of(model), P.params_of(loaded)
    assert list(a) == list(b) and all(np.array_equal(a[k], b[k]) and b[k].dtype == np.float32 for k in a)
    model.eval()
    assert torch.equal(model(src, tgt_in), loaded(src, tgt_in))
    again = P.from_params(CONFIG, b)
    assert torch.equal(again(src, tgt_in), loaded(src, tgt_in))
    # a config differing only where the weights do not depend on it is used, with a warning
    with pytest.warns(UserWarning, match="dropout"):
        assert P.load_weights(tmp_path / "w.safetensors", CONFIG.replace(dropout=0.0)).config.dropout == 0.0
    with pytest.raises(ValueError, match="d_ff"):
        P.load_weights(tmp_path / "w.safetensors", CONFIG.replace(d_ff=64))
    # params_of copies: training on does not change what it returned
    first = P.params_of(loaded)
    P.train_step(loaded, P.init_train_state(loaded), src, tgt_in, tgt_out)
    assert all(np.array_equal(first[k], b[k]) for k in b)


def test_canonical_parameters_are_refused():
    with pytest.raises(ValueError, match="Transformer\\(config, seed\\)"):
        P.from_params(CONFIG, spec.init_params(CONFIG, 0))
    params = P.params_of(P.Transformer(CONFIG, seed=0))
    with pytest.raises(ValueError, match="missing parameter 'embedding.weight'"):
        P.from_params(CONFIG, {k: v for k, v in params.items() if k != "embedding.weight"})
    with pytest.raises(ValueError, match="expected shape"):
        P.from_params(CONFIG, {**params, "embedding.weight": params["embedding.weight"][:-1]})


def test_signatures_follow_spec_api():
    problems = []
    for name in ("Transformer", "load_weights", "save_weights", "from_params", "params_of", "greedy_search",
                 "beam_search", "init_train_state", "train_step", "save_train_state", "load_train_state"):
        problems += api.compare_signature(f"peer.{name}", getattr(P, name), api.FUNCTIONS[name], skip_self=False)
    problems += api.compare_signature("peer.Transformer.__call__", P.Transformer.forward,
                             api.METHODS["Transformer"]["__call__"], skip_self=True)
    # The stock modules record no intermediates and drop out by their mode and the global RNG (the peer's train_step
    # scopes both): the forward takes neither argument.
    assert problems == [] or problems == [f"peer.Transformer.__call__: missing parameter {name!r}"
                                          for name in ("intermediates", "rng")]


def test_bad_input_raises_the_spec_errors():
    model = P.Transformer(CONFIG, seed=0)
    src, tgt_in, tgt_out = batch(CONFIG, np.random.default_rng(8))
    state = P.init_train_state(model)
    with pytest.raises(ValueError, match="outside"):
        model(src + CONFIG.vocab_size, tgt_in)
    with pytest.raises(ValueError, match="all padding"):
        P.greedy_search(model, np.zeros((1, 3), np.int64))
    with pytest.raises(ValueError, match="batch sizes differ"):
        P.train_step(model, state, src[:2], tgt_in, tgt_out)
    with pytest.raises(ValueError, match="every target is pad_id"):
        P.train_step(model, state, src, tgt_in, np.zeros_like(tgt_out))
    with pytest.raises(ValueError, match="beam_size"):
        P.beam_search(model, src, beam_size=0)
    with pytest.raises(ValueError, match="max_len"):
        P.greedy_search(model, src, max_new_tokens=CONFIG.max_len + 1)
    with pytest.raises(ValueError, match="d_model / n_heads"):
        P.Transformer(spec.preset("tiny"))
    assert state.step == 0
