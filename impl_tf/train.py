"""Training as the paper did it (section 5): the label-smoothed loss, Adam with the warmup schedule, dropout.

The definitions are ``spec.training``'s, in TensorFlow's idiom:

* The forward is the model's own (``Transformer._teacher_forced``: the numerics contract exactly as in evaluation),
  with ``layers.Dropout`` masks drawn by stateless ops from a seed that the train state's ``tf.random.Generator``
  gives each step; the loss is computed in fp32 from the float32 logits.
* A ``tf.GradientTape`` differentiates with respect to the model's variables. Every parameter enters the computation
  through ``layers.weight``, a rounding to ``config.dtype`` held in fp32 that passes its gradient straight through,
  so gradients are fp32 whatever ``param_dtype``: the master weights' (``spec.training``).
* Adam is written out: Keras' ``Adam`` adds its epsilon to the uncorrected sqrt(v), ``spec.training`` to the
  corrected one. The moments are fp32 ``tf.Variable``s of the ``TrainState``, keyed by canonical name (so they save
  and load in every framework); the learning rate of equation 3 and the bias corrections are computed on the host
  in float64 and rounded to fp32; each parameter is updated in fp32 and rounded once to ``param_dtype``.

Both entry points are ``tf.function(jit_compile=True)``, the train step one XLA program with the gradients, Adam and
the variable assignments inside, compiled once per model and shape bucket: as ``Transformer.__call__`` does, the
batch and lengths are padded to ``spec.shapes`` buckets, the targets with ``pad_id``. Padded targets count neither
in the loss nor in its denominator and padded source keys get exactly zero weight, so loss and gradients are the
batch's own (up to the order of fp32 sums); each new bucket logs one line at INFO on the ``"impl_tf"`` logger.
"""

from __future__ import annotations

import itertools
import os
import warnings

import numpy as np
import tensorflow as tf

from impl_tf.layers import Dropout
from impl_tf.model import Transformer, pad_ids
from spec import shapes, training, validate
from spec import train_state_io as spec_io
from spec.recording import recording
from spec.training import TrainConfig


class TrainState(tf.Module):
    """What training carries from step to step besides the weights (sections 5.3, 5.4), a ``tf.Module``.

    ``m``, ``v``: Adam's first and second moments, {canonical name: float32 ``tf.Variable`` of the parameter's
    shape} in ``spec.schema`` order; ``step``: an int64 ``tf.Variable``, the updates done (0 at first);
    ``train_config``: the ``spec.training.TrainConfig``; ``rng``: the ``tf.random.Generator`` (Philox) that each
    step's dropout seed is drawn from. ``train_step`` updates it in place.
    """

    def __init__(self, m: dict[str, np.ndarray], v: dict[str, np.ndarray], step: int, train_config: TrainConfig,
                 rng: tf.random.Generator):
        super().__init__(name="train_state")
        self.m, self.v = ({name: tf.Variable(x, dtype=tf.float32, trainable=False, name=f"{k}.{name}")
                           for name, x in moments.items()} for k, moments in (("m", m), ("v", v)))
        self.step = tf.Variable(step, dtype=tf.int64, trainable=False, name="step")
        self.train_config = train_config
        self.rng = rng


def _generator(seed: int) -> tf.random.Generator:
    return tf.random.Generator.from_seed(seed, alg="philox")


def init_train_state(model: Transformer, train_config: TrainConfig | None = None, seed: int = 0) -> TrainState:
    """A fresh train state for ``model``: zero fp32 moments, step 0, ``train_config`` (None: ``TrainConfig()``),
    the dropout generator ``tf.random.Generator.from_seed(seed, alg="philox")`` (sections 5.3, 5.4).

    Raises:
        ValueError: if ``seed`` is not a non-negative int.
    """
    if not validate.is_int(seed) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    zeros = {name: np.zeros(p.shape, np.float32) for name, p in model.parameters().items()}
    return TrainState(zeros, zeros, 0, TrainConfig() if train_config is None else train_config,
                      _generator(int(seed)))


def loss_and_gradients(model: Transformer, src, tgt_in, tgt_out, label_smoothing: float = 0.1
                       ) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """The label-smoothed loss of ``spec.training`` (section 5.4) and its gradient, in evaluation mode (no dropout).

    src (B, S), tgt_in (B, T), tgt_out (B, T) int ids (tensors, NumPy arrays or nested lists). Returns (loss, a
    () float32 tensor; {canonical name: float32 gradient of the parameter's shape} in ``spec.schema`` order). For
    fp32 parameters computing in bf16 these are the gradients of the fp32 master weights; for bf16 parameters, of
    their (exact) fp32 values.

    Raises:
        ValueError: from ``spec.validate.check_train_batch`` (``check_forward``, ``check_tokens("tgt_out", ...)``,
            a tgt_out shape other than tgt_in's, every target ``pad_id``); before anything is computed.
    """
    batch = _batch(model, "loss_and_gradients", src, tgt_in, tgt_out)
    loss, grads = _compiled(model, "loss_and_gradients", _loss_and_gradients, batch)(
        *batch, tf.constant(label_smoothing, tf.float32))
    return loss, dict(zip(model.parameters(), grads, strict=True))


def train_step(model: Transformer, state: TrainState, src, tgt_in, tgt_out
               ) -> tuple[tf.Tensor, Transformer, TrainState]:
    """One Adam step on one batch in training mode (sections 5.3, 5.4): -> (loss, model, state).

    src (B, S), tgt_in (B, T), tgt_out (B, T) int ids. Dropout at ``config.dropout`` on every sub-layer's output and
    on both embedding sums, with masks from a seed drawn from ``state.rng``; the loss as ``loss_and_gradients``
    (label smoothing of ``state.train_config``), a () float32 tensor, the batch's before the update; Adam's moments
    and update in fp32 with the learning rate of equation 3 at step ``state.step + 1``; each parameter rounded to
    ``config.param_dtype``. ``model`` and ``state`` are updated in place and returned.

    Raises:
        ValueError: as ``loss_and_gradients``, or if ``state`` was built for another model (parameter names or
            shapes); before anything is computed.
    """
    _check_state(model, state)
    batch = _batch(model, "train_step", src, tgt_in, tgt_out)
    loss = _compiled(model, "train_step", _train_step, batch)(*batch, state.rng.make_seeds(1)[:, 0],
                                                              _hyper(model, state), list(state.m.values()),
                                                              list(state.v.values()))
    state.step.assign_add(1)
    return loss, model, state


def save_train_state(state: TrainState, path: str | os.PathLike) -> None:
    """Write ``state`` in the canonical format of ``spec.train_state_io``: the moments as "m.<name>", "v.<name>"
    float32 in schema order, step and config as metadata, and the generator's Philox state as "rng" (int64 (3,),
    framework "tf"). The variables may be mirrored (``impl_tf.train_dp``): the first device's copy is written."""
    spec_io.save(path, spec_io.StoredState({k: x.numpy() for k, x in state.m.items()},
                                           {k: x.numpy() for k, x in state.v.items()}, int(state.step.numpy()),
                                           state.train_config, state.rng.state.numpy(), "tf"))


def load_train_state(path: str | os.PathLike, model: Transformer) -> TrainState:
    """The state ``save_train_state`` wrote, bit for bit, checked against ``model``'s parameter names and shapes.

    A file written by another framework keeps its moments, step and config (canonical); its dropout generator is
    seeded afresh from 0, with a ``UserWarning`` that dropout masks will differ.

    Raises:
        ValueError: from ``spec.train_state_io.load``: naming the file if it is unreadable or its metadata invalid,
            or naming the first moment that is missing, unexpected, or of the wrong shape or dtype for ``model``.
    """
    stored = spec_io.load(path, model.config)
    rng = _generator(0)
    if stored.framework == "tf" and stored.rng.dtype == np.int64 and stored.rng.shape == tuple(rng.state.shape):
        rng = tf.random.Generator.from_state(stored.rng, alg="philox")
    else:
        warnings.warn(f"{path}: a train state of framework {stored.framework!r} with another dropout RNG; its "
                      f"moments, step and config are kept, the RNG is seeded afresh from 0, so dropout masks will "
                      f"differ", stacklevel=2)
    return TrainState(stored.m, stored.v, stored.step, stored.train_config, rng)


# ----------------------------------------------------------------- internals

def _batch(model: Transformer, function: str, src, tgt_in, tgt_out) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The spec's checks of a training batch on host copies, then the ids as int32 padded to the forward's buckets
    with ``pad_id``: (Bb, Sb), (Bb, Tb), (Bb, Tb). Logs ``function``'s compilation if the bucket is new."""
    src, tgt_in, tgt_out = np.asarray(src), np.asarray(tgt_in), np.asarray(tgt_out)
    c = model.config
    validate.check_train_batch(src, tgt_in, tgt_out, c)
    (B, S), T = src.shape, tgt_in.shape[1]
    Bb, Sb, Tb = shapes.batch_bucket(B), shapes.length_bucket(S, c.max_len), shapes.length_bucket(T, c.max_len)
    model._compiling(function, (Bb, Sb, Tb), f"batch {Bb}, source length {Sb}, target length {Tb} (buckets)")
    return pad_ids(src, Bb, Sb, c.pad_id), pad_ids(tgt_in, Bb, Tb, c.pad_id), pad_ids(tgt_out, Bb, Tb, c.pad_id)


def _compiled(model: Transformer, function: str, fn, batch: tuple[tf.Tensor, ...]
              ) -> tf.types.experimental.PolymorphicFunction:
    """``fn`` compiled for the buckets of ``batch``. Not one shape-polymorphic trace: XLA compiles each shape anyway,
    and the gradient of a polymorphic trace's bf16 product (``impl_tf.layers``'s ``tf.cond`` on the row count) fails
    in XLA's dynamic padder for a one-row batch."""
    return model._compiled(f"{function} {' '.join(str(tuple(x.shape)) for x in batch)}", fn)


def _check_state(model: Transformer, state: TrainState) -> None:
    """``state``'s moments must have the model's parameter names, in order, and shapes."""
    params = model.parameters()
    for k in ("m", "v"):
        moments = getattr(state, k)
        for i, (have, want) in enumerate(itertools.zip_longest(moments, params)):
            if have != want:
                raise ValueError(f"train state: {k}'s parameter {i} is {have!r}, the model's is {want!r}")
            if moments[have].shape != params[want].shape:
                raise ValueError(f"train state: {k}.{have} has shape {tuple(moments[have].shape)}, the parameter "
                                 f"{tuple(params[want].shape)}")


def _hyper(model: Transformer, state: TrainState) -> dict[str, tf.Tensor]:
    """The fp32 scalars of the Adam step ``state.step + 1`` (equation 3's learning rate, the bias corrections, the
    betas, epsilon, label smoothing): float64 on the host, each rounded once to fp32."""
    tc, t = state.train_config, int(state.step.numpy()) + 1  # .numpy(): a mirrored variable too (train_dp)
    hyper = {"lr": training.learning_rate(t, model.config.d_model, tc.warmup_steps, tc.lr_scale),
             "correction1": 1 - tc.beta1 ** t, "correction2": 1 - tc.beta2 ** t, "beta1": tc.beta1,
             "beta2": tc.beta2, "eps": tc.adam_eps, "label_smoothing": tc.label_smoothing}
    return {k: tf.constant(x, tf.float32) for k, x in hyper.items()}


def _smoothed_loss(logits: tf.Tensor, tgt_out: tf.Tensor, pad_id: int, label_smoothing: tf.Tensor,
                   count: tf.Tensor | None = None) -> tf.Tensor:
    """``spec.training``'s loss in fp32: logits (B, T, V) float32, tgt_out (B, T) -> () the sum over non-pad
    targets of the cross-entropy with (1 - eps) one-hot + eps / V, divided by ``count`` (() float32: the global
    batch's non-pad targets when this batch is one worker's share of it, ``impl_tf.train_dp``) or, if None, by
    this batch's own: their mean."""
    V = logits.shape[-1]
    q = tf.one_hot(tgt_out, V, on_value=1.0 - label_smoothing + label_smoothing / V,
                   off_value=label_smoothing / V)                                        # (B, T, V) fp32
    per_token = tf.nn.softmax_cross_entropy_with_logits(q, logits)                       # (B, T) fp32
    weight = tf.cast(tgt_out != pad_id, tf.float32)                                      # (B, T): padding counts not
    return tf.reduce_sum(per_token * weight) / (tf.reduce_sum(weight) if count is None else count)  # () fp32


def _value_and_gradients(model: Transformer, src: tf.Tensor, tgt_in: tf.Tensor, tgt_out: tf.Tensor,
                         label_smoothing: tf.Tensor, dropout: Dropout | None, count: tf.Tensor | None = None
                         ) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """(loss () float32, fp32 gradients in schema order) of the model's forward, traced inside a tf.function; its
    records go to a dict of this trace's own. ``count``: the loss's denominator (``_smoothed_loss``)."""
    params = list(model.parameters().values())
    with tf.GradientTape() as tape, recording():
        logits = model._teacher_forced(src, tgt_in, dropout)                             # (B, T, V) float32
        loss = _smoothed_loss(logits, tgt_out, model.config.pad_id, label_smoothing, count)  # () float32
    # The shared embedding's gradient sums dense (output projection) and sparse (lookups) parts: made dense.
    return loss, [tf.convert_to_tensor(g) for g in tape.gradient(loss, params)]


def _loss_and_gradients(model: Transformer, src: tf.Tensor, tgt_in: tf.Tensor, tgt_out: tf.Tensor,
                        label_smoothing: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor]]:
    return _value_and_gradients(model, src, tgt_in, tgt_out, label_smoothing, None)


def _train_step(model: Transformer, src: tf.Tensor, tgt_in: tf.Tensor, tgt_out: tf.Tensor, seed: tf.Tensor,
                hyper: dict[str, tf.Tensor], m: list[tf.Variable], v: list[tf.Variable]) -> tf.Tensor:
    """One step on padded ids with dropout from ``seed`` (2,) int64: Adam (``spec.training.adam_update``) with the
    fp32 scalars ``hyper``, the moments ``m``, ``v`` and the parameters assigned in place; -> the loss."""
    dropout = Dropout(model.config.dropout, seed)
    loss, grads = _value_and_gradients(model, src, tgt_in, tgt_out, hyper["label_smoothing"], dropout)
    for p, g, m_var, v_var in zip(model.parameters().values(), grads, m, v, strict=True):
        _adam_update(p, g, m_var, v_var, hyper)
    return loss


def _adam_update(p: tf.Variable, g: tf.Tensor, m: tf.Variable, v: tf.Variable, hyper: dict[str, tf.Tensor]) -> None:
    """``spec.training.adam_update`` of one parameter ``p`` with its fp32 gradient ``g`` and moments ``m``, ``v``
    (p's shape), the fp32 scalars ``hyper`` (``_hyper``): moments and parameter assigned in place."""
    b1, b2 = hyper["beta1"], hyper["beta2"]
    m_new = b1 * m + (1.0 - b1) * g                                                      # fp32, p's shape
    v_new = b2 * v + (1.0 - b2) * tf.square(g)
    step = (m_new / hyper["correction1"]) / (tf.sqrt(v_new / hyper["correction2"]) + hyper["eps"])
    m.assign(m_new)
    v.assign(v_new)
    p.assign(tf.cast(tf.cast(p, tf.float32) - hyper["lr"] * step, p.dtype))            # rounded once
