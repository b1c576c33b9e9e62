"""Training: the loss, the schedule and Adam by hand, and the float64 backward against finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from spec import backward, training
from spec import reference as ref
from spec.config import TINY
from spec.init import init_params
from spec.numerics import Numerics

EXACT = Numerics("exact")
SRC = np.array([[5, 9, 17, 2, 0, 0], [7, 8, 9, 10, 11, 2]])           # (B, S), row 0 padded
TGT_IN = np.array([[1, 4, 5, 6, 0], [1, 7, 8, 9, 10]])                # (B, T)
TGT_OUT = np.array([[4, 5, 6, 2, 0], [7, 8, 9, 10, 2]])               # (B, T), one padding target


def _loss(P: dict, c, tgt_out=TGT_OUT, ls=0.1) -> float:
    """The loss through spec.reference's forward: independent of spec.backward's own forward."""
    return training.label_smoothed_cross_entropy(ref.forward(P, SRC, TGT_IN, c, EXACT), tgt_out, c, ls)


def test_loss_by_hand():
    c, V = TINY, TINY.vocab_size
    z = np.zeros((1, 2, V))                                          # uniform predictions: -log p = log V
    assert training.label_smoothed_cross_entropy(z, np.array([[4, 7]]), c, 0.1) == pytest.approx(np.log(V))
    z[0, 0, 4] = 3.0                                                 # position 0: p_y = e^3 / (e^3 + V - 1)
    lse = np.log(np.exp(3.0) + V - 1)
    pos0 = 0.9 * (lse - 3.0) + 0.1 * (lse - 3.0 / V)                 # (1-eps)(-log p_y) + eps mean_v(-log p_v)
    assert training.label_smoothed_cross_entropy(z, np.array([[4, 7]]), c, 0.1) == pytest.approx(
        (pos0 + np.log(V)) / 2)
    # a padding target counts neither in the sum nor in the mean's denominator
    assert training.label_smoothed_cross_entropy(z, np.array([[4, c.pad_id]]), c, 0.1) == pytest.approx(pos0)
    assert training.label_smoothed_cross_entropy(z, np.array([[4, 7]]), c, 0.0) == pytest.approx(
        (lse - 3.0 + np.log(V)) / 2)                                 # epsilon 0: plain NLL


def test_loss_rejects_all_padding_and_bad_shapes():
    z = np.zeros((1, 2, TINY.vocab_size))
    with pytest.raises(ValueError, match="every target is pad_id"):
        training.label_smoothed_cross_entropy(z, np.zeros((1, 2), int), TINY, 0.1)
    with pytest.raises(ValueError, match="must be"):
        training.label_smoothed_cross_entropy(z, np.zeros((1, 3), int), TINY, 0.1)


def test_loss_gradient_is_the_derivative_of_the_loss():
    rng = np.random.default_rng(1)
    z, u, h = rng.standard_normal((2, 5, TINY.vocab_size)), rng.standard_normal((2, 5, TINY.vocab_size)), 1e-6
    loss = lambda x: training.label_smoothed_cross_entropy(x, TGT_OUT, TINY, 0.1)  # noqa: E731
    fd = (loss(z + h * u) - loss(z - h * u)) / (2 * h)
    assert (training.loss_gradient(z, TGT_OUT, TINY, 0.1) * u).sum() == pytest.approx(fd, rel=1e-7)


def test_learning_rate_is_equation_3():
    d, w = 512, 4000
    assert training.learning_rate(1, d, w) == pytest.approx(d ** -0.5 * w ** -1.5)      # linear warmup from step 1
    assert training.learning_rate(w, d, w) == pytest.approx(d ** -0.5 * w ** -0.5)      # the peak, at warmup_steps
    assert training.learning_rate(4 * w, d, w) == pytest.approx(d ** -0.5 * (4 * w) ** -0.5)  # then 1/sqrt(step)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="step must be an int >= 1"):
            training.learning_rate(bad, d, w)


def test_train_config_rejects_bad_values():
    for field, bad in (("label_smoothing", 1.0), ("beta2", -0.1), ("adam_eps", 0.0), ("warmup_steps", 0)):
        with pytest.raises(ValueError, match=f"TrainConfig.{field}"):
            training.TrainConfig(**{field: bad})


def test_adam_first_step_moves_each_weight_by_the_learning_rate():
    """At t = 1 bias correction gives m_hat = g, v_hat = g^2: the step is lr * g / (|g| + eps)."""
    tc = training.TrainConfig(warmup_steps=10)
    p, g = {"w": np.array([1.0, 2.0, 3.0])}, {"w": np.array([0.5, -2.0, 0.0])}
    new, state = training.adam_update(p, g, training.adam_init(p), d_model=16, tc=tc)
    lr = training.learning_rate(1, 16, 10)
    np.testing.assert_allclose(new["w"], [1.0 - lr * 0.5 / (0.5 + 1e-9), 2.0 + lr * 2.0 / (2.0 + 1e-9), 3.0])
    assert state.step == 1
    np.testing.assert_allclose(state.v["w"], 0.02 * g["w"] ** 2)     # (1 - beta2) g^2


OPTIONS = {"post_ln": {}, "pre_ln": {"norm_first": True},
           "gelu_learned": {"activation": "gelu", "attention_bias": True, "positions": "learned",
                            "scale_embedding": False},
           "marian": {"activation": "silu", "attention_bias": True, "logits_bias": True,
                      "positions": "sinusoidal_halves"},
           "gelu_tanh_pre_ln": {"activation": "gelu_tanh", "logits_bias": True, "norm_first": True}}


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS)
def test_backward_matches_finite_differences(options):
    """Every parameter's gradient against a central difference of the reference forward along a random
    direction in that parameter alone (so one missing or misplaced gradient cannot hide in a sum), with the
    paper's layers and with the checkpoint options of ``spec.config``."""
    c = TINY.replace(dtype="float32", param_dtype="float32", **options)
    params = init_params(c, 3, observable=True)
    loss, grads = backward.loss_and_gradients(params, SRC, TGT_IN, TGT_OUT, c)
    P = ref.as_float64(params, c)
    assert loss == pytest.approx(_loss(P, c), rel=1e-12)
    rng, h = np.random.default_rng(0), 1e-5
    for name in P:
        u = rng.standard_normal(P[name].shape)
        fd = (_loss({**P, name: P[name] + h * u}, c) - _loss({**P, name: P[name] - h * u}, c)) / (2 * h)
        # abs: the difference quotient's own rounding, 2^-52 |loss| / h, times 10; it decides only for a gradient
        # that is exactly 0 (b_k: softmax ignores a constant added to a query's scores)
        assert (grads[name] * u).sum() == pytest.approx(fd, rel=1e-6, abs=10 * 2**-52 * loss / h), name


def test_backward_of_a_bf16_model_is_the_gradient_at_its_rounded_weights():
    """Rule 0: a bf16 config computes with bf16-rounded weights; the rounding passes the gradient through."""
    c32 = TINY.replace(dtype="float32", param_dtype="float32")
    params = init_params(c32, 4, observable=True)
    _, g_mixed = backward.loss_and_gradients(params, SRC, TGT_IN, TGT_OUT, c32.replace(dtype="bfloat16"))
    rounded = ref.as_float64(params, c32.replace(dtype="bfloat16"))
    _, g_rounded = backward.loss_and_gradients(rounded, SRC, TGT_IN, TGT_OUT, c32)
    for name in g_mixed:
        np.testing.assert_array_equal(g_mixed[name], g_rounded[name])


def test_backward_rejects_mismatched_targets():
    with pytest.raises(ValueError, match="tgt_out: shape"):
        backward.loss_and_gradients(init_params(TINY, 0), SRC, TGT_IN, TGT_OUT[:, :3], TINY)
