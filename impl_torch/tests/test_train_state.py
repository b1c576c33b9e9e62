"""The train-state file (spec.train_state_io): a saved state continues bit for bit, another framework's keeps its
moments, a state for another model is refused."""

from __future__ import annotations

import numpy as np
import pytest
import safetensors.numpy
import torch

import impl_torch as T
import spec
from spec import training

SRC = np.array([[5, 9, 17, 2, 0, 0], [7, 8, 9, 10, 11, 2]])           # (B, S), row 0 padded
TGT_IN = np.array([[1, 4, 5, 6, 0], [1, 7, 8, 9, 10]])                # (B, T)
TGT_OUT = np.array([[4, 5, 6, 2, 0], [7, 8, 9, 10, 2]])               # (B, T), one padding target
MIXED = spec.preset("tiny", dtype="bfloat16", param_dtype="float32")
OPTIONS = MIXED.replace(activation="gelu_tanh", attention_bias=True, logits_bias=True, positions="learned",
                        scale_embedding=False)                          # every checkpoint option off the paper's
WARMUP10 = training.TrainConfig(warmup_steps=10)                       # large, visible steps


@pytest.mark.parametrize("config", [MIXED, OPTIONS], ids=["paper", "options"])
def test_a_saved_state_continues_bit_for_bit(tmp_path, config):
    model = T.Transformer(config, seed=0)
    state = T.init_train_state(model, WARMUP10, seed=7)
    for _ in range(2):
        T.train_step(model, state, SRC, TGT_IN, TGT_OUT)
    T.save_train_state(state, tmp_path / "state.safetensors")
    T.save_weights(model, tmp_path / "model.safetensors")
    model2 = T.load_weights(tmp_path / "model.safetensors").train()
    state2 = T.load_train_state(tmp_path / "state.safetensors", model2)
    assert (state2.step, state2.train_config) == (2, WARMUP10)
    assert torch.equal(state2.rng.get_state(), state.rng.get_state())
    assert all(torch.equal(state2.m[k], state.m[k]) and torch.equal(state2.v[k], state.v[k]) for k in state.m)
    for _ in range(2):
        loss = T.train_step(model, state, SRC, TGT_IN, TGT_OUT)[0]
        loss2 = T.train_step(model2, state2, SRC, TGT_IN, TGT_OUT)[0]
        assert float(loss) == float(loss2)
    p, p2 = T.params_of(model), T.params_of(model2)
    assert all((p[k].view(np.uint8) == p2[k].view(np.uint8)).all() for k in p)


def test_a_state_of_another_framework_keeps_moments_and_reseeds_the_rng(tmp_path):
    model = T.Transformer(MIXED, seed=0)
    state = T.init_train_state(model, WARMUP10, seed=7)
    T.train_step(model, state, SRC, TGT_IN, TGT_OUT)
    T.save_train_state(state, tmp_path / "s.safetensors")
    arrays = safetensors.numpy.load_file(tmp_path / "s.safetensors")
    arrays["rng"] = np.array([0, 7], np.uint32)                          # a JAX key, say
    meta = {"step": "1", "train_config": '{"warmup_steps": 10}', "framework": "jax"}
    safetensors.numpy.save_file(arrays, tmp_path / "jax.safetensors", metadata=meta)
    with pytest.warns(UserWarning, match="dropout masks will differ"):
        loaded = T.load_train_state(tmp_path / "jax.safetensors", model)
    assert loaded.step == 1 and loaded.train_config == WARMUP10
    assert all(torch.equal(loaded.v[k], state.v[k]) for k in state.v)
    assert torch.equal(loaded.rng.get_state(), torch.Generator().manual_seed(0).get_state())


def test_a_state_for_another_model_is_rejected(tmp_path):
    model = T.Transformer(MIXED, seed=0)
    other = T.Transformer(MIXED.replace(d_ff=40), seed=0)
    T.save_train_state(T.init_train_state(model), tmp_path / "s.safetensors")
    with pytest.raises(ValueError, match="moment 'm.encoder.layers.0.ffn.w_1'"):
        T.load_train_state(tmp_path / "s.safetensors", other)
    with pytest.raises(ValueError, match="train state: m.encoder.layers.0.ffn.w_1 has shape"):
        T.train_step(other, T.init_train_state(model), SRC, TGT_IN, TGT_OUT)
    pre_ln = T.Transformer(MIXED.replace(norm_first=True), seed=0)
    with pytest.raises(ValueError, match="m's parameter 25 is 'decoder.layers.0.self_attn.w_q', the model's is "
                                         "'encoder.final_norm.scale'"):
        T.train_step(pre_ln, T.init_train_state(model), SRC, TGT_IN, TGT_OUT)
    with pytest.raises(ValueError, match="not a train state file"):
        T.load_train_state(tmp_path / "missing.safetensors", model)
