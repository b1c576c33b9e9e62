"""Training as the paper did it (section 5): label-smoothed loss, Adam, the warmup schedule, dropout; the average
of the last checkpoints (section 6.1).

Every backend trains by these definitions; the float64 NumPy versions here are the reference
(``spec.backward`` gives the gradient).

Loss (section 5.4, "label smoothing of value epsilon_ls = 0.1"; Szegedy et al., 2016). For logits z (B, T, V)
and targets y = tgt_out (B, T), with p = softmax(z) over V and the smoothed target distribution

    q_v = (1 - epsilon) [v = y] + epsilon / V          (the mass epsilon spread uniformly over all V ids,
                                                        the target and pad_id included)

the loss of one position is ``-sum_v q_v log p_v = (1 - epsilon) (-log p_y) + epsilon mean_v(-log p_v)``, and the
batch loss is the mean over the N positions whose target is not ``pad_id``. Padding positions count neither in
the sum nor in N. This is the convention of ``torch.nn.functional.cross_entropy(label_smoothing=)``,
``optax.smooth_labels`` and Keras' ``CategoricalCrossentropy(label_smoothing=)``. Backends compute it in fp32 from
the float32 logits (``spec.numerics`` rule 7), whatever ``config.dtype``.

Optimizer (section 5.3): Adam (Kingma & Ba, 2015) with bias correction, beta1 = 0.9, beta2 = 0.98,
epsilon = 1e-9, the epsilon added outside the square root, as ``torch.optim.Adam`` and ``optax.adam`` do::

    m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2            (t = 1, 2, ... after the update)
    param -= lrate(t) * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + epsilon)

with the schedule (equation 3) ``lrate(t) = d_model^-0.5 * min(t^-0.5, t * warmup_steps^-1.5)``, warmup_steps
4000. (Keras' ``Adam`` adds its epsilon to the uncorrected sqrt(v); impl_tf does not use it for that reason.)

Mixed precision: fp32 master weights (``param_dtype="float32"``) computing in ``dtype="bfloat16"`` per
``spec.numerics`` rule 0; the loss, the gradients of the master weights and Adam's state and update in fp32.
The rounding of a weight to bf16 passes its gradient through unchanged. Pure fp32 (both dtypes float32) and pure
bf16 (both bfloat16; Adam's state and update still fp32, the updated weight rounded to bf16) stay available.

Dropout (section 5.4) at rate ``config.dropout`` in training mode only: on the output of every sub-layer before
the residual add (and before the norm), and on the sums of embeddings and positional encodings in both stacks.
Kept values are divided by 1 - rate (inverted dropout: the divisor rounded to fp32, the quotient computed in fp32 and
rounded once to the activation dtype), so evaluation is the identity (rule 8). The sites, in order:
``spec.shapes.dropout_sites``. Masks are a backend's own random draws; a forward with intermediates records each
site's value after dropout and its keep mask as ``<site>.keep``, so that ``conformance/test_dropout.py`` judges a
training-mode forward against the reference replaying the backend's own masks (``spec.reference.layers.dropout``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from spec.config import Config
from spec.numerics import Numerics

Params = dict[str, np.ndarray]
EXACT = Numerics("exact")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The paper's training hyper-parameters (section 5.3, 5.4); ``warmup_steps`` shorter for small demos.

    ``lr_scale`` multiplies equation 3 (tensor2tensor's ``learning_rate_constant``): the paper's schedule peaks at
    d_model^-0.5 * warmup_steps^-0.5, so a short warmup alone forces a high peak; the scale sets the peak apart.

    Raises:
        ValueError: naming the field, if ``label_smoothing`` is outside [0, 1), a beta outside [0, 1),
            ``adam_eps`` not positive or ``warmup_steps`` not a positive int.
    """

    label_smoothing: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.98
    adam_eps: float = 1e-9
    warmup_steps: int = 4000
    lr_scale: float = 1.0

    def __post_init__(self) -> None:
        for name in ("label_smoothing", "beta1", "beta2"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0.0 <= value < 1.0):
                raise ValueError(f"TrainConfig.{name} must lie in [0, 1), got {value!r}")
        if not (isinstance(self.adam_eps, float) and self.adam_eps > 0.0):
            raise ValueError(f"TrainConfig.adam_eps must be a positive float, got {self.adam_eps!r}")
        if not (isinstance(self.warmup_steps, int) and not isinstance(self.warmup_steps, bool)
                and self.warmup_steps > 0):
            raise ValueError(f"TrainConfig.warmup_steps must be a positive int, got {self.warmup_steps!r}")
        if not (isinstance(self.lr_scale, (int, float)) and not isinstance(self.lr_scale, bool)
                and 0.0 < self.lr_scale < float("inf")):
            raise ValueError(f"TrainConfig.lr_scale must be a positive finite number, got {self.lr_scale!r}")


def learning_rate(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """``scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)`` (equation 3, times
    ``TrainConfig.lr_scale``); steps count from 1.

    Raises:
        ValueError: if ``step`` is not an int >= 1.
    """
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 1:
        raise ValueError(f"learning_rate: step must be an int >= 1, got {step!r}")
    return scale * d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)


def log_softmax(z: np.ndarray) -> np.ndarray:
    """Max-subtracted log-softmax over the last axis (float64)."""
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def label_smoothed_cross_entropy(logits: np.ndarray, tgt_out: np.ndarray, c: Config,
                                 label_smoothing: float) -> float:
    """The mean smoothed loss over non-pad targets (module docstring): logits (B, T, V), tgt_out (B, T) int.

    Raises:
        ValueError: if the shapes disagree or every target is ``pad_id`` (the mean would be over nothing).
    """
    z, y = np.asarray(logits, np.float64), np.asarray(tgt_out)
    if z.shape[:2] != y.shape or z.ndim != 3:
        raise ValueError(f"loss: logits {z.shape} and tgt_out {y.shape} must be (B, T, V) and (B, T)")
    weight = y != c.pad_id                                                    # (B, T)
    if not weight.any():
        raise ValueError("loss: every target is pad_id; the mean over non-pad positions is undefined")
    logp = log_softmax(z)                                                     # (B, T, V)
    nll = -np.take_along_axis(logp, y[..., None], axis=-1)[..., 0]           # (B, T)
    per_token = (1.0 - label_smoothing) * nll - label_smoothing * logp.mean(axis=-1)
    return float((per_token * weight).sum() / weight.sum())


def loss_gradient(logits: np.ndarray, tgt_out: np.ndarray, c: Config, label_smoothing: float) -> np.ndarray:
    """d loss / d logits (B, T, V) of ``label_smoothed_cross_entropy``: (softmax(z) - q) / N at non-pad targets."""
    z, y = np.asarray(logits, np.float64), np.asarray(tgt_out)
    weight = (y != c.pad_id).astype(np.float64)                               # (B, T)
    q = np.full(z.shape, label_smoothing / z.shape[-1])                       # (B, T, V)
    np.put_along_axis(q, y[..., None], 1.0 - label_smoothing + label_smoothing / z.shape[-1], axis=-1)
    return (np.exp(log_softmax(z)) - q) * (weight / weight.sum())[..., None]


@dataclasses.dataclass
class AdamState:
    """Adam's state: ``step`` (updates done), first and second moments ``m``, ``v`` per parameter name."""

    step: int
    m: Params
    v: Params


def adam_init(params: Params) -> AdamState:
    """Zero moments, step 0."""
    zeros = {k: np.zeros(np.shape(p)) for k, p in params.items()}
    return AdamState(0, zeros, {k: z.copy() for k, z in zeros.items()})


def adam_update(params: Params, grads: Params, state: AdamState, d_model: int,
                tc: TrainConfig, nx: Numerics = EXACT) -> tuple[Params, AdamState]:
    """One Adam step with the scheduled learning rate (module docstring): -> (params, state).

    Float64 by default. With a faithful ``nx`` (``spec.backward``'s ideal backend) the moments and the new weights
    are each rounded to fp32 once, as fp32 state and fp32 master weights hold them at best.
    """
    t = state.step + 1
    lr = learning_rate(t, d_model, tc.warmup_steps, tc.lr_scale)
    m = {k: nx.acc(tc.beta1 * state.m[k] + (1 - tc.beta1) * g) for k, g in grads.items()}
    v = {k: nx.acc(tc.beta2 * state.v[k] + (1 - tc.beta2) * g * g) for k, g in grads.items()}
    new = {k: nx.acc(p - lr * (m[k] / (1 - tc.beta1 ** t)) / (np.sqrt(v[k] / (1 - tc.beta2 ** t)) + tc.adam_eps))
           for k, p in params.items()}
    return new, AdamState(t, m, v)


def average_params(checkpoints: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The element-wise mean of parameter sets with the same names and shapes (section 6.1), computed in float64
    and rounded once to each parameter's dtype.

    Raises:
        ValueError: if ``checkpoints`` is empty or their names or shapes differ.
    """
    if not checkpoints:
        raise ValueError("average: no checkpoint given")
    last = checkpoints[-1]
    for i, c in enumerate(checkpoints):
        if c.keys() != last.keys() or any(np.shape(c[k]) != np.shape(last[k]) for k in last):
            raise ValueError(f"average: checkpoint {i} has other parameter names or shapes than the last")
    return {name: np.mean([np.asarray(c[name], np.float64) for c in checkpoints], axis=0).astype(p.dtype)
            for name, p in last.items()}
