"""Training as the paper did it (section 5): the label-smoothed loss, Adam with the warmup schedule, dropout.

The definitions are ``spec.training``'s, in TensorFlow's idiom:

* The forward is the model's own (``impl_tf.stacks.forward_logits``, ``impl_tf.lm.forward_logits``: the numerics
  contract exactly as in evaluation), with ``layers.dropout`` masks drawn by stateless ops from a seed that the
  train state's ``tf.random.Generator`` gives each step; the loss is computed in fp32 from the float32 logits. A
  ``LanguageModel`` learns next-token prediction: its logits of ``tokens[:, :-1]`` against ``tokens[:, 1:]``.
* A ``tf.GradientTape`` differentiates with respect to the model's variables. Every parameter enters the computation
  through ``numerics.round_to``, a rounding to ``config.dtype`` held in fp32 that passes its gradient straight
  through, so gradients are fp32 whatever ``param_dtype``: the master weights' (``spec.training``).
* Adam is written out: Keras' ``Adam`` adds its epsilon to the uncorrected sqrt(v), ``spec.training`` to the
  corrected one. The moments are fp32 ``tf.Variable``s of the ``TrainState``, keyed by canonical name (so they save
  and load in every framework); the learning rate of equation 3 and the bias corrections are computed on the host
  in float64 and rounded to fp32 (``adam_scalars``, ``adam_update``'s keyword ``scalars``); each parameter is
  updated in fp32 and rounded once to ``param_dtype``.

The entry points are programs of the model (its ``compiled``). A train step runs two: the loss and gradients, the
program ``loss_and_gradients`` runs when the model draws no dropout, compiled once per shape bucket, then Adam with
the variable assignments inside, compiled once per config whatever the shape (a new bucket compiles only the first).
As the forward does, the batch and lengths are padded to ``spec.shapes`` buckets, the targets with ``pad_id``.
Padded targets count neither in the loss nor in its denominator and padded source keys get exactly zero weight, so
loss and gradients are the batch's own (up to the order of fp32 sums). Not one shape-polymorphic trace: XLA compiles
each shape anyway, and the gradient of a polymorphic trace's bf16 product (``numerics.matmul_f32``'s ``tf.cond`` on
the row count) fails in XLA's dynamic padder for a one-row batch. ``mirrored_step`` is ``impl_tf.train_dp``'s step,
the same loss, gradients and Adam on the replicas of a ``tf.distribute`` strategy. The ``TrainState`` and its file
are ``impl_tf.train_state``'s.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from impl_tf import lm
from impl_tf.inputs import device_ids, host_ids, stateless_seed
from impl_tf.lm import LanguageModel, Model
from impl_tf.model import Transformer
from impl_tf.programs import compiled
from impl_tf.stacks import forward_logits
from impl_tf.train_state import TrainState, check_state
from spec import shapes, training, validate
from spec.recording import recording

SUM = tf.distribute.ReduceOp.SUM  # the data-parallel reduction (``mirrored_step``, ``impl_tf.train_dp``)


def loss_and_gradients(model: Transformer, src, tgt_in, tgt_out, label_smoothing: float = 0.1
                       ) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """Returns (loss, a () float32 tensor; {canonical name: float32 gradient} in ``spec.schema`` order)."""
    return _gradients(model, "loss_and_gradients", *_batch(model, src, tgt_in, tgt_out), label_smoothing)


def train_step(model: Transformer, state: TrainState, src, tgt_in, tgt_out
               ) -> tuple[tf.Tensor, Transformer, TrainState]:
    """One compiled step; dropout masks from a seed drawn from ``state.rng``; ``model`` and ``state`` are updated
    in place and returned.

    Raises:
        ValueError: as ``spec.api``, or if ``state`` was built for another model (parameter names or shapes).
    """
    check_state(model, state)
    return _step(model, state, "loss_and_gradients", *_batch(model, src, tgt_in, tgt_out))


def lm_loss_and_gradients(model: LanguageModel, tokens, label_smoothing: float = 0.0, *, rng=None
                          ) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """As ``loss_and_gradients``; ``rng``: dropout from a stateless seed, as ``LanguageModel.forward``'s (None, the
    default, evaluates)."""
    return _gradients(model, "lm_loss_and_gradients", *_lm_batch(model, tokens), label_smoothing, rng)


def lm_train_step(model: LanguageModel, state: TrainState, tokens) -> tuple[tf.Tensor, LanguageModel, TrainState]:
    """As ``train_step``, for next-token prediction on tokens (B, T)."""
    check_state(model, state)
    return _step(model, state, "lm_loss_and_gradients", *_lm_batch(model, tokens))


def smoothed_loss(logits: tf.Tensor, tgt_out: tf.Tensor, label_smoothing: tf.Tensor, pad_id: int, *,
                  count: tf.Tensor | None = None) -> tf.Tensor:
    """``spec.training``'s label-smoothed cross entropy (section 5.4) in fp32: logits (B, T, V) float32, tgt_out
    (B, T) -> () the sum over non-pad targets of the cross-entropy with (1 - eps) one-hot + eps / V, divided by
    ``count`` (() float32: the global batch's non-pad targets when this batch is one worker's share of it,
    ``impl_tf.train_dp``) or, if None, by this batch's own: their mean."""
    V = logits.shape[-1]
    q = tf.one_hot(tgt_out, V, on_value=1.0 - label_smoothing + label_smoothing / V,
                   off_value=label_smoothing / V)                                        # (B, T, V) fp32
    per_token = tf.nn.softmax_cross_entropy_with_logits(q, logits)                       # (B, T) fp32
    weight = tf.cast(tgt_out != pad_id, tf.float32)                                      # (B, T): padding counts not
    return tf.reduce_sum(per_token * weight) / (tf.reduce_sum(weight) if count is None else count)  # () fp32


def adam_update(params: dict[str, tf.Variable], grads: dict[str, tf.Tensor], state: TrainState, *,
                scalars: dict[str, tf.Tensor]) -> None:
    """``spec.training.adam_update`` (section 5.3) in place: each parameter of ``params`` with its fp32 gradient
    ``grads[name]`` and moments ``state.m[name]``, ``state.v[name]`` (its shape); the moments in fp32, the parameter
    updated in fp32 and rounded once to its dtype.

    ``scalars`` (keyword-only and required; the three common arguments keep their order): the step's learning rate,
    bias corrections, betas and epsilon, ``adam_scalars(model, state)``: ``spec.training``'s float64 arithmetic on
    the host, each rounded once to fp32, passed into the compiled step as tensors (one program whatever the step
    and the train config)."""
    b1, b2 = scalars["beta1"], scalars["beta2"]
    for name, p in params.items():
        g, m, v = grads[name], state.m[name], state.v[name]
        m_new = b1 * m + (1.0 - b1) * g                                                  # fp32, p's shape
        v_new = b2 * v + (1.0 - b2) * tf.square(g)
        step = (m_new / scalars["correction1"]) / (tf.sqrt(v_new / scalars["correction2"]) + scalars["eps"])
        m.assign(m_new)
        v.assign(v_new)
        p.assign(tf.cast(tf.cast(p, tf.float32) - scalars["lr"] * step, p.dtype))      # rounded once


def adam_scalars(model: Model, state: TrainState) -> dict[str, tf.Tensor]:
    """The fp32 scalars of the Adam step ``state.step + 1`` (equation 3's learning rate, the bias corrections, the
    betas, epsilon, label smoothing): float64 on the host, each rounded once to fp32."""
    tc, t = state.train_config, int(state.step.numpy()) + 1  # .numpy(): a mirrored variable too (train_dp)
    scalars = {"lr": training.learning_rate(t, model.config.d_model, tc.warmup_steps, tc.lr_scale),
               "correction1": 1 - tc.beta1 ** t, "correction2": 1 - tc.beta2 ** t, "beta1": tc.beta1,
               "beta2": tc.beta2, "eps": tc.adam_eps, "label_smoothing": tc.label_smoothing}
    return {k: tf.constant(x, tf.float32) for k, x in scalars.items()}


def mirrored_step(model: Transformer, state: TrainState, strategy: tf.distribute.Strategy, src, tgt_in, tgt_out,
                  count: tf.Tensor, scalars: dict[str, tf.Tensor]) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """``impl_tf.train_dp``'s step, in cross-replica context, of a model and state mirrored by ``strategy``, on
    per-replica padded ids src (Bs, Sb), tgt_in, tgt_out (Bs, Tb) int32, ``count`` () float32 the global batch's
    non-pad targets and the step's fp32 ``scalars`` (``adam_scalars``): per-replica shares and gradients, their
    all-reduce, Adam on every copy; -> (the global loss () float32, the global gradients in schema order, fp32, each
    its parameter's shape)."""

    # One XLA program per replica (a MirroredStrategy traces it once per device, XLA compiles each concrete shape):
    # the layers' bf16 products are written for XLA (impl_tf.numerics), and it is faster (docs/decisions-tf.md).
    @functools.partial(tf.function, jit_compile=True)
    def gradient(src, tgt_in, tgt_out, seed, count, label_smoothing) -> tuple[tf.Tensor, list[tf.Tensor]]:
        # (Bs, Sb), (Bs, Tb), (Bs, Tb) int32 -> (this replica's share sum_local / count, its fp32 gradients)
        with tf.GradientTape() as tape, recording():
            logits = forward_logits(model, src, tgt_in, seed)                              # (Bs, Tb, V) float32
            share = smoothed_loss(logits, tgt_out, label_smoothing, model.config.pad_id, count=count)
        # The shared embedding's gradient sums dense (output projection) and sparse (lookups) parts: made dense.
        return share, [tf.convert_to_tensor(g) for g in tape.gradient(share, list(model.params.values()))]

    def replica(*ids: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor]]:
        # in replica context: its dropout seed (2,) int64 from its own stream of the generator (impl_tf.train_dp)
        return gradient(*ids, state.rng.make_seeds(1)[:, 0], count, scalars["label_smoothing"])

    shares, grads = strategy.run(replica, args=(src, tgt_in, tgt_out))
    params = model.params
    # The engine's all-reduce: each gradient summed over the replicas and placed on its variable's devices.
    grads = strategy.extended.batch_reduce_to(SUM, list(zip(grads, params.values(), strict=True)))
    for (name, p), g in zip(params.items(), grads, strict=True):
        # fn(p's copy on a device, that device's g, m, v): the same update on the same values in every replica
        update = lambda p, g, m, v, s, n=name: adam_update(  # noqa: E731
            {n: p}, {n: g}, TrainState(None, None, {n: m}, {n: v}, None), scalars=s)
        strategy.extended.update(p, update, args=(g, state.m[name], state.v[name], scalars), group=False)
    loss = strategy.reduce(SUM, shares, axis=None)                                       # () the sum of the shares
    return loss, [strategy.experimental_local_results(g)[0] for g in grads]


# ----------------------------------------------------------------- internals

def _batch(model: Transformer, src, tgt_in, tgt_out) -> tuple[tuple[int, int, int], tuple[tf.Tensor, ...]]:
    """The spec's checks of a training batch on host copies, then (the buckets (Bb, Sb, Tb), the ids as int32
    padded to them with ``pad_id``: (Bb, Sb), (Bb, Tb), (Bb, Tb))."""
    src, tgt_in, tgt_out = host_ids(src), host_ids(tgt_in, "tgt_in"), host_ids(tgt_out, "tgt_out")
    c = model.config
    validate.check_model_kind(c, decoder_only=False)
    validate.check_train_batch(src, tgt_in, tgt_out, c)
    (B, S), T = src.shape, tgt_in.shape[1]
    Bb, Sb, Tb = shapes.batch_bucket(B), shapes.length_bucket(S, c.max_len), shapes.length_bucket(T, c.max_len)
    return (Bb, Sb, Tb), (device_ids(src, Bb, Sb, c.pad_id), device_ids(tgt_in, Bb, Tb, c.pad_id),
                          device_ids(tgt_out, Bb, Tb, c.pad_id))


def _lm_batch(model: LanguageModel, tokens) -> tuple[tuple[int, int], tuple[tf.Tensor]]:
    """The spec's checks of a next-token batch (B, T) on a host copy, then (the buckets (Bb, Tb), (the tokens as
    int32 (Bb, Tb) padded with ``pad_id``,))."""
    tokens, c = host_ids(tokens, "tokens"), model.config
    validate.check_model_kind(c, decoder_only=True)
    validate.check_lm_batch(tokens, c)
    size = (shapes.batch_bucket(tokens.shape[0]), shapes.length_bucket(tokens.shape[1], c.max_len))
    return size, (device_ids(tokens, *size, c.pad_id),)


def _gradients(model: Model, name: str, size: tuple[int, ...], batch: tuple[tf.Tensor, ...],
               label_smoothing: float | tf.Tensor, rng=None) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """The entry points' (loss, {canonical name: gradient}) of a padded ``batch`` (``_inputs_targets``), by the program
    ``name`` for its buckets ``size``; ``rng`` as ``LanguageModel.forward``'s."""
    seed = [] if rng is None else [stateless_seed(rng)]
    fn = lambda batch, *args: _loss_and_gradients(model, *_inputs_targets(model, batch), *args)  # noqa: E731
    loss, grads = compiled(model, name + (" with dropout" if seed else ""), fn, None, size, dropout=bool(seed))(
        batch, tf.convert_to_tensor(label_smoothing, tf.float32), *seed)
    return loss, dict(zip(model.params, grads, strict=True))


def _step(model: Model, state: TrainState, name: str, size: tuple[int, ...], batch: tuple[tf.Tensor, ...]
          ) -> tuple[tf.Tensor, Model, TrainState]:
    """A train step on a padded ``batch`` (``_inputs_targets``) for its buckets ``size``: the gradients by the
    program of ``name`` (the loss and gradients entry point's own when the model draws no dropout), then Adam by a
    program of the config, compiled once whatever the shape. The seed is drawn whether or not it is used, so the
    generator's stream does not depend on the rate."""
    seed, scalars = state.rng.make_seeds(1)[:, 0], adam_scalars(model, state)
    loss, grads = _gradients(model, name, size, batch, scalars["label_smoothing"],
                             seed if model.config.dropout > 0.0 else None)
    update = lambda g, s, m, v: adam_update(  # noqa: E731
        model.params, g, TrainState(None, None, m, v, None), scalars=s)
    compiled(model, "adam", update, None, (), dropout=False)(grads, scalars, state.m, state.v)
    state.step.assign_add(1)
    return loss, model, state


def _inputs_targets(model: Model, batch: tuple[tf.Tensor, ...]) -> tuple[tuple[tf.Tensor, ...], tf.Tensor]:
    """(the forward's inputs, the targets (B, T)) of a padded batch: a ``Transformer``'s (src, tgt_in, tgt_out)
    -> ((src, tgt_in), tgt_out); a ``LanguageModel``'s (tokens,) -> ((tokens[:, :-1],), tokens[:, 1:])."""
    if model.config.decoder_only:
        (tokens,) = batch
        return (tokens[:, :-1],), tokens[:, 1:]
    src, tgt_in, tgt_out = batch
    return (src, tgt_in), tgt_out


def _loss_and_gradients(model: Model, inputs: tuple[tf.Tensor, ...], tgt_out: tf.Tensor,
                        label_smoothing: tf.Tensor, rng: tf.Tensor | None = None
                        ) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """(loss () float32, fp32 gradients in schema order) of the model's forward on padded ``inputs`` against
    ``tgt_out`` (``_inputs_targets``), traced inside a tf.function; its records go to a dict of this trace's own.
    ``rng`` as ``layers.dropout``'s."""
    forward = lm.forward_logits if model.config.decoder_only else forward_logits
    with tf.GradientTape() as tape, recording():
        logits = forward(model, *inputs, rng)                                            # (B, T, V) float32
        loss = smoothed_loss(logits, tgt_out, label_smoothing, model.config.pad_id)      # () float32
    # The shared embedding's gradient sums dense (output projection) and sparse (lookups) parts: made dense.
    return loss, [tf.convert_to_tensor(g) for g in tape.gradient(loss, list(model.params.values()))]
