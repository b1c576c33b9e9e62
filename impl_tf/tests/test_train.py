"""Training (``spec.training``; sections 5.3, 5.4) in impl_tf: gradients against ``spec.backward``, judged by
``spec.tolerance``'s training policy (the measured margins: docs/decisions-tf.md, "Training conformance margins");
the dtypes of a step, dropout in a step, a model that learns, bad input, no global state (the train state and its
file: test_train_state.py). Adam's steps against ``spec.training.adam_update`` are conformance's (the golden
training cases).

The models compile once per test module; tests that train put the weights back with ``_restore`` rather than
building a new model.
"""

from __future__ import annotations

import logging
import time
import warnings

import numpy as np
import pytest
import tensorflow as tf

import impl_tf
import spec
from spec import backward, golden_training, tolerance
from spec.numerics import Numerics
from spec.training import TrainConfig

# fp32 products must stay fp32 on GPUs (spec.numerics rule 8): the harness's process-wide choice, not the library's.
tf.config.experimental.enable_tensor_float_32_execution(False)

F32 = spec.preset("tiny", dtype="float32", param_dtype="float32").replace(dropout=0.0)
MIXED = spec.preset("tiny", dtype="bfloat16", param_dtype="float32").replace(dropout=0.0)
BF16 = spec.preset("tiny")  # pure bf16 (both dtypes), dropout 0.1
TC = golden_training.TRAIN_CONFIG  # TrainConfig(warmup_steps=10): each step moves a weight visibly
# Every parameter the checkpoint options add (spec.config): attention biases, learned positions, the logits bias.
OPTIONS = dict(activation="gelu", attention_bias=True, logits_bias=True, positions="learned", scale_embedding=False)


def _batches(c) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Three (B, S) = (3, 9), (B, T) = (3, 8) batches with padded source rows and pad targets (as the golden
    training cases): src, tgt_in, tgt_out."""
    b = golden_training.make_batches(c, golden_training.CASES["train_tiny_float32"], np.random.default_rng(2))
    return list(zip(b["src"], b["tgt_in"], b["tgt_out"], strict=True))


def _restore(model: impl_tf.Transformer, params: dict[str, np.ndarray]) -> None:
    """Put canonical ``params`` back into the model's variables (keeps its compiled functions)."""
    for name, var in model.params.items():
        var.assign(params[name])


@pytest.fixture(scope="module")
def model32():
    return impl_tf.Transformer(F32, seed=0)


@pytest.fixture(scope="module")
def model_bf16():
    return impl_tf.Transformer(BF16, seed=0)


@pytest.fixture(scope="module")
def params32(model32):
    return impl_tf.params_of(model32)


@pytest.fixture(scope="module")
def params_bf16(model_bf16):
    return impl_tf.params_of(model_bf16)


def _judge_gradients(loss, grads, params, batch, c, label_smoothing=0.1) -> dict[str, tolerance.Verdict]:
    """Loss and each gradient by ``tolerance.judge_gradient`` against ``spec.backward``: exact (float64) and faithful
    in ``c.dtype`` (the ideal's error, the yardstick)."""
    exact = backward.loss_and_gradients(params, *batch, c, label_smoothing)
    faithful = backward.loss_and_gradients(params, *batch, c, label_smoothing, Numerics(c.dtype))
    pairs = {"loss": (np.asarray(loss), np.asarray(exact[0]), np.asarray(faithful[0]))}
    pairs.update({name: (g.numpy(), exact[1][name], faithful[1][name]) for name, g in grads.items()})
    return {name: tolerance.judge_gradient(a, x, tolerance.error_stats(f, x, c.dtype))
            for name, (a, x, f) in pairs.items()}


def _worst(verdicts: dict[str, tolerance.Verdict]) -> str:
    name = max(verdicts, key=lambda k: verdicts[k].stats.max_eps)
    v = verdicts[name]
    return f"{name}: {v.stats.max_eps:.3g} ulps max (allowed {v.max_eps_allowed:.3g}), ratio {v.ratio:.3g}"


# ----------------------------------------------------------------- gradients

def test_fp32_gradients_match_backward(model32, params32):
    """Every fp32 gradient and the loss within 16x the faithful fp32 backward's error (floor 8 ulps) of float64."""
    batch = _batches(F32)[0]
    loss, grads = impl_tf.loss_and_gradients(model32, *batch, label_smoothing=0.1)
    assert loss.dtype == tf.float32 and loss.shape == ()
    assert list(grads) == list(params32)
    assert all(g.dtype == tf.float32 and tuple(g.shape) == params32[k].shape for k, g in grads.items())
    verdicts = _judge_gradients(loss, grads, params32, batch, F32)
    print("fp32 worst:", _worst(verdicts), "| loss:", verdicts["loss"].reason())
    assert all(v.ok for v in verdicts.values()), {k: v.reason() for k, v in verdicts.items() if not v.ok}
    assert max(v.stats.max_eps for v in verdicts.values()) < 200  # measured 50 fp32 ulps; the policy's worst: 16x29


def test_mixed_gradients_are_the_master_weights(params32):
    """bf16 compute, fp32 parameters: fp32 gradients of the fp32 shapes, finite, within the bf16 policy (4x the
    faithful bf16 backward's max error, 2x its RMS, floor 1 ulp) of the float64 gradient at the rounded weights."""
    model = impl_tf.from_params(MIXED, params32)
    batch = _batches(MIXED)[0]
    loss, grads = impl_tf.loss_and_gradients(model, *batch)
    assert all(g.dtype == tf.float32 and tuple(g.shape) == params32[k].shape for k, g in grads.items())
    assert all(np.isfinite(g.numpy()).all() for g in grads.values())
    verdicts = _judge_gradients(loss, grads, params32, batch, MIXED)
    print("mixed worst:", _worst(verdicts))
    assert all(v.ok for v in verdicts.values()), {k: v.reason() for k, v in verdicts.items() if not v.ok}


# ----------------------------------------------------------------- Adam

@pytest.mark.parametrize("options", [{}, OPTIONS], ids=["paper", "options"])
def test_pure_bf16_step_keeps_dtypes(model_bf16, params_bf16, options, copy_task):
    """Both dtypes bf16: the moments fp32, the updated weights bf16, every weight moved, the options' too but the
    zero-initialised b_k, whose gradient is rounding noise (q . b_k adds alike to all of a query's scores)."""
    src, tgt_in, tgt_out = copy_task
    _restore(model_bf16, params_bf16)
    model = impl_tf.Transformer(BF16.replace(**options), seed=0) if options else model_bf16
    before, state = impl_tf.params_of(model), impl_tf.init_train_state(model, TC)
    impl_tf.train_step(model, state, src, tgt_in, tgt_out)
    after = impl_tf.params_of(model)
    assert all(m.dtype == tf.float32 for m in (*state.m.values(), *state.v.values()))
    assert all(str(p.dtype) == "bfloat16" for p in after.values())
    assert all(not np.array_equal(after[k], before[k]) for k in after if not k.endswith(".b_k"))


# ----------------------------------------------------------------- dropout

def test_train_step_masks_come_from_the_state(model_bf16, params_bf16, copy_task):
    """Equal states and seeds give bit-identical steps, whatever TensorFlow's global RNG does in between; another
    seed gives other masks, so another loss and other weights."""
    src, tgt_in, tgt_out = copy_task

    def two_steps(seed: int) -> tuple[list[float], dict[str, np.ndarray]]:
        _restore(model_bf16, params_bf16)
        state = impl_tf.init_train_state(model_bf16, TC, seed=seed)
        losses = []
        for _ in range(2):
            tf.random.uniform([3])  # the global RNG, consumed: must change nothing
            losses.append(float(impl_tf.train_step(model_bf16, state, src, tgt_in, tgt_out)[0]))
        return losses, impl_tf.params_of(model_bf16)

    (la, pa), (lb, pb), (lc, pc) = two_steps(0), two_steps(0), two_steps(1)
    assert la == lb and all(pa[k].tobytes() == pb[k].tobytes() for k in pa)
    assert la[0] != lc[0] and any(pa[k].tobytes() != pc[k].tobytes() for k in pa)
    assert la[0] != la[1]  # a fresh mask (and new weights) at the second step


# ----------------------------------------------------------------- learning

def test_model_learns_a_copy_task(model_bf16, params_bf16, copy_task):
    """Pure bf16, dropout 0.1: 100 steps on 4 fixed sequences take the loss below half its first value."""
    src, tgt_in, tgt_out = copy_task
    _restore(model_bf16, params_bf16)
    state = impl_tf.init_train_state(model_bf16, TrainConfig(warmup_steps=20), seed=0)
    start = time.perf_counter()
    losses = [float(impl_tf.train_step(model_bf16, state, src, tgt_in, tgt_out)[0]) for _ in range(100)]
    print(f"copy task: loss {losses[0]:.3f} -> {losses[-1]:.3f} in {time.perf_counter() - start:.1f} s")
    assert np.isfinite(losses).all() and losses[-1] < 0.5 * losses[0]


def test_a_model_that_decoded_and_trained_still_lists_its_parameters(model_bf16, params_bf16, copy_task, tmp_path):
    """``tf.Module`` walks every attribute, the compiled functions' table too, to list variables (``params``,
    ``save_weights``): decoding, then a training step of a new shape, must leave that walk working."""
    src, tgt_in, tgt_out = copy_task
    _restore(model_bf16, params_bf16)
    impl_tf.greedy_search(model_bf16, src, max_new_tokens=3)
    state = impl_tf.init_train_state(model_bf16, TC, seed=0)
    impl_tf.train_step(model_bf16, state, src[:1], tgt_in[:1], tgt_out[:1])
    assert list(model_bf16.params) == list(params_bf16)
    impl_tf.save_weights(model_bf16, tmp_path / "model.safetensors")
    _restore(model_bf16, params_bf16)


def test_a_new_shape_compiles_only_the_gradients(model32, params32, caplog):
    """A train step runs the loss and gradients program (``loss_and_gradients``' own, the model drawing no dropout)
    and an Adam program of the config: a step at a shape whose gradients were computed compiles nothing."""
    src, tgt_in, tgt_out = _batches(F32)[0]
    state = impl_tf.init_train_state(model32, TC)
    impl_tf.train_step(model32, state, src, tgt_in, tgt_out)                       # Adam compiled, at any shape
    with caplog.at_level(logging.INFO, logger="impl_tf"):
        impl_tf.loss_and_gradients(model32, src[:1], tgt_in[:1], tgt_out[:1])      # a new batch bucket
        compiled = [r.getMessage() for r in caplog.records]
        impl_tf.train_step(model32, state, src[:1], tgt_in[:1], tgt_out[:1])
        assert [r.getMessage() for r in caplog.records] == compiled
    assert compiled == ["impl_tf: compiling loss_and_gradients for shape (1, 16, 8)"]
    _restore(model32, params32)


# ----------------------------------------------------------------- bad input

def test_bad_batches_raise_before_computing(model32):
    src, tgt_in, tgt_out = _batches(F32)[0]
    state, before = impl_tf.init_train_state(model32), impl_tf.params_of(model32)
    for f in (lambda *b: impl_tf.train_step(model32, state, *b), lambda *b: impl_tf.loss_and_gradients(model32, *b)):
        with pytest.raises(ValueError, match=r"tgt_out: shape \(3, 7\) differs from tgt_in's \(3, 8\)"):
            f(src, tgt_in, tgt_out[:, :7])
        with pytest.raises(ValueError, match="every target is pad_id"):
            f(src, tgt_in, np.zeros_like(tgt_out))
        with pytest.raises(ValueError, match="tgt_out"):
            f(src, tgt_in, np.full_like(tgt_out, F32.vocab_size))
        with pytest.raises(ValueError, match="src"):
            f(src.astype(np.float32), tgt_in, tgt_out)
    assert int(state.step) == 0
    assert all(np.array_equal(p, before[k]) for k, p in impl_tf.params_of(model32).items())


# ----------------------------------------------------------------- no global state

def test_training_changes_no_global_state(model32, params32):
    """A train step sets no TensorFlow flag and touches neither TensorFlow's global generator nor NumPy's RNG."""
    from tensorflow.python.framework.config import is_op_determinism_enabled  # no public getter

    def flags():
        return (tf.config.experimental.tensor_float_32_execution_enabled(), is_op_determinism_enabled(),
                tf.config.get_soft_device_placement(), tf.config.functions_run_eagerly())

    before = (flags(), tf.random.get_global_generator().state.numpy().tobytes(), str(np.random.get_state()))
    _restore(model32, params32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        impl_tf.train_step(model32, impl_tf.init_train_state(model32, seed=3), *_batches(F32)[0])
    after = (flags(), tf.random.get_global_generator().state.numpy().tobytes(), str(np.random.get_state()))
    assert before == after
    _restore(model32, params32)
