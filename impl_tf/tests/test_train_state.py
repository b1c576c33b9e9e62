"""The train state (``impl_tf.train_state``, ``spec.train_state_io``): a saved and loaded state goes on bit for bit,
another framework's file keeps its moments and reseeds the dropout generator, a state of another model and bad seeds
are refused before anything is computed."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import impl_tf
import spec
from spec import golden_training
from spec import train_state_io as spec_io

# fp32 products must stay fp32 on GPUs (spec.numerics rule 8): the harness's process-wide choice, not the library's.
tf.config.experimental.enable_tensor_float_32_execution(False)

F32 = spec.preset("tiny", dtype="float32", param_dtype="float32").replace(dropout=0.0)
BF16 = spec.preset("tiny")  # pure bf16 (both dtypes), dropout 0.1: the dropout generator matters
TC = golden_training.TRAIN_CONFIG  # TrainConfig(warmup_steps=10): each step moves a weight visibly
# Every parameter the checkpoint options add (spec.config): attention biases, learned positions, the logits bias.
OPTIONS = dict(activation="gelu", attention_bias=True, logits_bias=True, positions="learned", scale_embedding=False)


@pytest.fixture(scope="module")
def model32():
    return impl_tf.Transformer(F32, seed=0)  # variables only: no test here compiles it


@pytest.mark.parametrize("options", [{}, OPTIONS], ids=["paper", "options"])
def test_save_and_load_continue_bit_for_bit(options, tmp_path, copy_task):
    """Going on from a saved and loaded state (dropout on: the RNG matters) gives the same weights, bit for bit."""
    src, tgt_in, tgt_out = copy_task
    model = impl_tf.Transformer(BF16.replace(**options), seed=0)
    state = impl_tf.init_train_state(model, TC, seed=7)
    impl_tf.train_step(model, state, src, tgt_in, tgt_out)
    impl_tf.save_train_state(state, tmp_path / "state.safetensors")
    weights = impl_tf.params_of(model)
    impl_tf.train_step(model, state, src, tgt_in, tgt_out)
    want = impl_tf.params_of(model)

    for name, var in model.params.items():  # back to the weights of the saved step
        var.assign(weights[name])
    loaded = impl_tf.load_train_state(tmp_path / "state.safetensors", model)
    assert int(loaded.step) == 1 and loaded.train_config == TC
    impl_tf.train_step(model, loaded, src, tgt_in, tgt_out)
    got = impl_tf.params_of(model)
    assert all(want[k].tobytes() == got[k].tobytes() for k in want)
    assert all(np.array_equal(state.m[k].numpy(), loaded.m[k].numpy()) for k in state.m)
    np.testing.assert_array_equal(state.rng.state.numpy(), loaded.rng.state.numpy())


def test_load_another_frameworks_state(model32, tmp_path):
    """A file written by another framework: moments, step and config kept, the RNG seeded from 0 with a warning."""
    names = list(model32.params)
    rng = np.random.default_rng(0)
    m = {k: rng.standard_normal(p.shape).astype(np.float32) for k, p in model32.params.items()}
    spec_io.save(tmp_path / "torch.safetensors",
                 spec_io.StoredState(m, m, 5, TC, np.zeros(16, np.uint8), "torch"))
    with pytest.warns(UserWarning, match="dropout masks will differ"):
        state = impl_tf.load_train_state(tmp_path / "torch.safetensors", model32)
    assert list(state.m) == names and int(state.step) == 5 and state.train_config == TC
    assert all(np.array_equal(state.v[k].numpy(), m[k]) for k in names)
    fresh = impl_tf.init_train_state(model32, seed=0)
    np.testing.assert_array_equal(state.rng.state.numpy(), fresh.rng.state.numpy())


def test_state_of_another_model_and_bad_seeds(model32, tmp_path, copy_task):
    other = impl_tf.Transformer(F32.replace(d_ff=40), seed=0)  # variables only: nothing compiles
    src, tgt_in, tgt_out = copy_task
    with pytest.raises(ValueError, match=r"train state: m.encoder.layers.0.ffn.w_1 has shape \(32, 40\)"):
        impl_tf.train_step(model32, impl_tf.init_train_state(other), src, tgt_in, tgt_out)
    fewer = impl_tf.Transformer(F32.replace(n_decoder_layers=1), seed=0)
    with pytest.raises(ValueError, match="train state: m's parameter"):
        impl_tf.train_step(model32, impl_tf.init_train_state(fewer), src, tgt_in, tgt_out)
    impl_tf.save_train_state(impl_tf.init_train_state(other), tmp_path / "other.safetensors")
    with pytest.raises(ValueError, match="moment 'm.encoder.layers.0.ffn.w_1' is float32 \\(32, 40\\)"):
        impl_tf.load_train_state(tmp_path / "other.safetensors", model32)
    for seed in (-1, 1.0, True, "0", None):
        with pytest.raises(ValueError, match="seed must be a non-negative int"):
            impl_tf.init_train_state(model32, seed=seed)
