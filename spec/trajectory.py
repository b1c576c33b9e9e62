"""A training run of the reference (``spec.training``, ``spec.backward``): one Adam step per batch, exact (float64)
or faithful (``Numerics(c.dtype)``), from master weights that enter the computation rounded to ``c.dtype``."""

from __future__ import annotations

import numpy as np

from spec import backward, training
from spec.config import Config
from spec.numerics import Numerics, np_dtype


def model_weights(master: dict[str, np.ndarray], c: Config) -> dict[str, np.ndarray]:
    """Master weights (float64 arrays) as they enter the computation: rounded to ``c.dtype`` if bf16 (rule 0), as
    they are in fp32 (the exact trajectory's float64 weights are not rounded; the faithful one's hold fp32 values)."""
    if c.dtype == "float32":
        return master
    bf16 = np_dtype(c.dtype)
    return {k: v.astype(np.float32).astype(bf16).astype(np.float64) for k, v in master.items()}


def trajectory(params: dict[str, np.ndarray], batches: list[tuple[np.ndarray, np.ndarray, np.ndarray]], c: Config,
               tc: training.TrainConfig, nx: Numerics) -> dict:
    """A training run, exact (float64) or faithful (``Numerics(c.dtype)``): one Adam step per batch.

    Returns {"loss": [loss before each step], "grads": [gradients of each step], "params": [weights after each
    step]}, weights as float64 arrays.
    """
    master = {k: np.asarray(v, np.float64) for k, v in params.items()}
    state = training.adam_init(master)
    out = {"loss": [], "grads": [], "params": []}
    for batch in batches:
        loss, grads = backward.gradients_at(model_weights(master, c), *_teacher_forced(batch), c, tc.label_smoothing,
                                            nx)
        master, state = training.adam_update(master, grads, state, c.d_model, tc, nx)
        out["loss"].append(loss)
        out["grads"].append(grads)
        out["params"].append(master)
    return out


def _teacher_forced(batch: tuple) -> tuple:
    """A batch as (src, tgt_in, tgt_out): a decoder-only batch (tokens,) as (None, inputs, next tokens)."""
    return batch if len(batch) == 3 else (None, batch[0][:, :-1], batch[0][:, 1:])


def batches_of(inputs: dict[str, np.ndarray]) -> list[tuple[np.ndarray, ...]]:
    """A case's inputs as one batch per step: (src, tgt_in, tgt_out), or (tokens,) for a decoder-only model."""
    if "tokens" in inputs:
        return [(t,) for t in inputs["tokens"]]
    return list(zip(inputs["src"], inputs["tgt_in"], inputs["tgt_out"], strict=True))
