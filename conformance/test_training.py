"""Training over many steps: every backend's loss curve against the spec's exact trajectory.

The golden cases (``test_golden.py``) judge three steps tensor by tensor; here 50 Adam steps from the same weights
on the same batches, dropout off, must give a loss at every step within the policy's bound for a loss
(``spec.tolerance.judge_gradient``) of the faithful trajectory's error, computed live (the errors measured against
those bounds: docs/decisions.md, "Tolerances").
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance.oracle import golden_training
from spec import golden_cases, tolerance
from spec.config import TINY
from spec.numerics import Numerics
from spec.training import TrainConfig

pytestmark = pytest.mark.needs("train")  # before the reference's trajectory, seconds each, is computed

STEPS = 50
TRAIN = TrainConfig(warmup_steps=10)


def _batches(c) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """50 padded batches (B=4, S=9, T=8) in the style of the golden training cases, one per step."""
    case = golden_training.TrainCase("curve", "tiny", c.dtype, 31, 4, 9, 8, (1.0, 1), (1.0, 1))
    out = []
    for i in range(STEPS):
        b = golden_training.make_batches(c, case, np.random.default_rng(i))
        out.append((b["src"][0], b["tgt_in"][0], b["tgt_out"][0]))
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"], ids=["fp32", "mixed"])
def test_loss_curve_of_50_steps_follows_the_spec(dtype, load_model, record):
    c = TINY.replace(dtype=dtype, param_dtype="float32", dropout=0.0)
    params, batches = golden_cases.make_params(c, 31), _batches(c)
    exact, faithful = (np.array(golden_training.trajectory(params, batches, c, TRAIN, nx)["loss"])
                       for nx in (Numerics("exact"), Numerics(dtype)))
    got = load_model(c, params).train(batches, TRAIN, record_after=())["loss"]              # (STEPS,)
    assert got.shape == (STEPS,) and np.isfinite(got).all()
    assert got[-1] < got[0] - 0.5, f"the loss did not fall: {got[0]:.3f} -> {got[-1]:.3f}"
    record({"loss_curve": tolerance.judge_gradient(got, exact, tolerance.error_stats(faithful, exact, dtype))})


def test_the_learning_rate_scale_is_applied(load_model, record):
    """``TrainConfig.lr_scale`` multiplies equation 3: 10 fp32 steps at a quarter of the schedule follow the spec's
    exact trajectory at that scale (a backend that ignores the scale takes four times the steps and leaves it)."""
    c, tc = TINY.replace(dtype="float32", param_dtype="float32", dropout=0.0), TrainConfig(warmup_steps=10,
                                                                                           lr_scale=0.25)
    params, batches = golden_cases.make_params(c, 31), _batches(c)[:10]
    exact, faithful = (np.array(golden_training.trajectory(params, batches, c, tc, nx)["loss"])
                       for nx in (Numerics("exact"), Numerics("float32")))
    got = load_model(c, params).train(batches, tc, record_after=())["loss"]                   # (10,)
    record({"loss_curve_lr_scale": tolerance.judge_gradient(got, exact,
                                                            tolerance.error_stats(faithful, exact, "float32"))})


# (B, S, T) per step: the second shape makes a shape-polymorphic trace, and one-row batches follow, as the
# last batch of a length bucket gives in real training.
SHAPES = ((4, 9, 8), (1, 9, 8), (2, 5, 12), (1, 16, 4), (3, 9, 8), (1, 4, 5))


def test_training_on_batches_of_changing_shape_follows_the_spec(load_model, record):
    """Mixed precision, one batch shape per step (``SHAPES``): every step's loss against the spec's trajectory."""
    c = TINY.replace(dtype="bfloat16", param_dtype="float32", dropout=0.0)
    params, rng = golden_cases.make_params(c, 31), np.random.default_rng(5)
    batches = []
    for B, S, T in SHAPES:
        case = golden_training.TrainCase("shapes", "tiny", c.dtype, 31, B, S, T, (1.0, 1), (1.0, 1))
        b = golden_training.make_batches(c, case, rng)
        batches.append((b["src"][0], b["tgt_in"][0], b["tgt_out"][0]))
    exact, faithful = (np.array(golden_training.trajectory(params, batches, c, TRAIN, nx)["loss"])
                       for nx in (Numerics("exact"), Numerics(c.dtype)))
    got = load_model(c, params).train(batches, TRAIN, record_after=())["loss"]              # (len(SHAPES),)
    record({"loss_changing_shapes": tolerance.judge_gradient(got, exact,
                                                             tolerance.error_stats(faithful, exact, c.dtype))})
