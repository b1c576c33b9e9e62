"""Training as the paper did it (section 5): the label-smoothed loss, Adam with the warmup schedule, dropout.

The definitions are ``spec.training``'s, as pure functions jitted once per shape bucket:

* The forward is the model's own (``Transformer.forward``, ``LanguageModel.forward`` on ``tokens[:, :-1]``, the
  numerics contract exactly as in evaluation), with dropout from a PRNG key split off the state's; the loss is
  computed in fp32 from the float32 logits.
* ``jax.value_and_grad`` differentiates with respect to fp32 copies of the parameters, so gradients are fp32 whatever
  ``param_dtype``; the rounding of a weight to ``config.dtype`` passes its gradient through unchanged
  (``numerics.round_to``), where autodiff of ``astype`` would round the gradient to bf16.
* Adam is ``optax.scale_by_adam`` (eps outside the square root of the bias-corrected second moment, as
  ``spec.training``) over fp32 moments and fp32 gradients, times the learning rate of equation 3; each updated
  parameter is computed in fp32 and rounded once to ``param_dtype``. ``optax.adam`` itself would keep the second
  moment in the parameters' dtype (``mu_dtype`` covers only the first), bf16 for a pure-bf16 model.

Shapes: as the models' forward, the batch and the lengths are padded to buckets (``spec.shapes``), targets with
``pad_id``. Padded targets count neither in the loss nor in its denominator, and padded source keys get exactly zero
weight, so loss and gradients are the batch's own (up to the order of fp32 sums) while a stream of batch shapes
compiles a bounded number of programs, each logged once at INFO on the ``"impl_jax"`` logger. A train step runs two
jitted programs: the loss and gradients (``loss_and_gradients``' own when the model draws no dropout), one per
shape bucket, then Adam, one per config whatever the shape, so a new bucket compiles only the first.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax

from impl_jax import numerics
from impl_jax.inputs import Ids, device_ids, host_ids
from impl_jax.layers import Module, without_dropout
from impl_jax.lm import LanguageModel
from impl_jax.model import Transformer, log
from impl_jax.train_state import TrainState, check_state
from impl_jax.weights import canonical
from spec import shapes, validate

F32 = jnp.float32


def loss_and_gradients(model: Transformer, src: Ids, tgt_in: Ids, tgt_out: Ids, label_smoothing: float = 0.1
                       ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Evaluation mode: the label-smoothed loss and {canonical name: float32 gradient} (``spec.api``); for bf16
    parameters the gradients of their (exact) fp32 values."""
    *inputs, tgt_out = _batch(model, src, tgt_in, tgt_out)
    loss, grads = loss_and_gradients_program(without_dropout(model), tuple(inputs), tgt_out,
                                             jnp.asarray(label_smoothing, F32), None)
    return loss, canonical(grads)


def train_step(model: Transformer, state: TrainState, src: Ids, tgt_in: Ids, tgt_out: Ids
               ) -> tuple[jax.Array, Transformer, TrainState]:
    """One Adam step in training mode -> (loss before the update, new model, new state) (``spec.api``); the model
    and state passed in are left unchanged. Raises ``ValueError`` also if ``state`` was built for another model."""
    *inputs, tgt_out = _batch(model, src, tgt_in, tgt_out)
    return _step(model, state, tuple(inputs), tgt_out)


def lm_loss_and_gradients(model: LanguageModel, tokens: Ids, label_smoothing: float = 0.0, *,
                          rng: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Next-token prediction's loss and {canonical name: float32 gradient} (``spec.api``), as
    ``loss_and_gradients``; with a PRNG key ``rng``, with dropout drawn from it."""
    inputs, targets = _lm_batch(model, tokens)
    loss, grads = loss_and_gradients_program(model if rng is not None else without_dropout(model), (inputs,),
                                             targets, jnp.asarray(label_smoothing, F32), rng)
    return loss, canonical(grads)


def lm_train_step(model: LanguageModel, state: TrainState, tokens: Ids) -> tuple[jax.Array, LanguageModel, TrainState]:
    """One Adam step of next-token prediction in training mode, as ``train_step`` (``spec.api``)."""
    inputs, targets = _lm_batch(model, tokens)
    return _step(model, state, (inputs,), targets)


def smoothed_loss(logits: jax.Array, tgt_out: jax.Array, label_smoothing: jax.Array | float, pad_id: int, *,
                  count: jax.Array | None = None) -> jax.Array:
    """Section 5.4's label-smoothed cross entropy: logits (B, T, V) float32, tgt_out (B, T) -> () float32, the sum
    over the non-pad targets divided by ``count`` (the global batch's non-pad targets when this batch is a share of
    it) or, if None, by this batch's own: their mean."""
    q = optax.smooth_labels(jax.nn.one_hot(tgt_out, logits.shape[-1], dtype=F32), label_smoothing)  # (B, T, V)
    per_token = optax.softmax_cross_entropy(logits, q)                                 # (B, T) float32
    weight = (tgt_out != pad_id).astype(F32)                                           # (B, T): padding counts not
    return (per_token * weight).sum() / (weight.sum() if count is None else count)


def adam_update(params: dict[str, jax.Array], grads: dict[str, jax.Array], state: TrainState
                ) -> tuple[dict[str, jax.Array], TrainState]:
    """Section 5.3: one Adam step of the canonical ``params`` by the fp32 ``grads`` -> (the new params, each
    computed in fp32 and rounded once to its dtype; the state with the new step and moments). The learning rate is
    equation 3's at the new step, D the embedding's width (``spec.training.learning_rate``)."""
    tc = state.train_config
    adam = optax.scale_by_adam(b1=tc.beta1, b2=tc.beta2, eps=tc.adam_eps)
    updates, adam_state = adam.update(grads, optax.ScaleByAdamState(state.step, state.m, state.v))  # fp32
    t, d_model = adam_state.count.astype(F32), params["embedding"].shape[-1]
    lr = tc.lr_scale * d_model ** -0.5 * jnp.minimum(t ** -0.5, t * tc.warmup_steps ** -1.5)
    new = {name: (p.astype(F32) - lr * updates[name]).astype(p.dtype) for name, p in params.items()}
    return new, dataclasses.replace(state, step=adam_state.count, m=adam_state.mu, v=adam_state.nu)


@numerics.jit
def loss_and_gradients_program(model: Module, inputs: tuple[jax.Array, ...], tgt_out: jax.Array,
                               label_smoothing: jax.Array, rng: jax.Array | None) -> tuple[jax.Array, Module]:
    """The jitted program of the entry points' loss and gradients after their checks (``.lower`` it to inspect it):
    either model, its validated inputs on the buckets ((src (B, S), tgt_in (B, T)) or (tokens (B, T),)), targets
    (B, T) int32, label smoothing () float32, a dropout key or None -> (loss () float32, fp32 gradients as a model
    of the same structure)."""
    c = model.config
    log.info("impl_jax: compiling loss_and_gradients for batch %d, lengths %s (buckets)", tgt_out.shape[0],
             [x.shape[1] for x in inputs])
    return jax.value_and_grad(lambda m: smoothed_loss(m(*inputs, rng=rng), tgt_out, label_smoothing, c.pad_id))(
        jax.tree.map(lambda p: p.astype(F32), model))  # fp32 master weights (exact): fp32 gradients


@functools.partial(numerics.jit, donate_argnums=1)  # the gradients' buffers are free to hold the new moments
def adam_program(model: Module, grads: Module, state: TrainState) -> tuple[Module, TrainState]:
    """The jitted Adam step of ``train_step``: a model, its fp32 gradients (``loss_and_gradients_program``'s) and
    its state -> (the updated model, the state with the new step and moments, the key unchanged); one program per
    config and train config, whatever the batch's shape."""
    log.info("impl_jax: compiling the Adam step of %s", type(model).__name__)
    params, state = adam_update(canonical(model), canonical(grads), state)
    return type(model)(model.config, params=params), state


# ----------------------------------------------------------------- internals

def _batch(model: Transformer, src: Ids, tgt_in: Ids, tgt_out: Ids) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``spec.validate.check_train_batch`` on host copies, then the ids as int32, padded to the forward's buckets:
    (Bb, Sb), (Bb, Tb) twice."""
    config = model.config
    src_host, tgt_host, out_host = (host_ids(src, config), host_ids(tgt_in, config, "tgt_in"),
                                    host_ids(tgt_out, config, "tgt_out"))
    validate.check_train_batch(src_host, tgt_host, out_host, config)
    (B, S), T = src_host.shape, tgt_host.shape[1]
    Bb, Tb = shapes.batch_bucket(B), shapes.length_bucket(T, config.max_len)
    return (device_ids(src, Bb, shapes.length_bucket(S, config.max_len), config.pad_id),  # (Bb, Sb)
            device_ids(tgt_in, Bb, Tb, config.pad_id),                                  # (Bb, Tb)
            device_ids(tgt_out, Bb, Tb, config.pad_id))                                 # (Bb, Tb)


def _lm_batch(model: LanguageModel, tokens: Ids) -> tuple[jax.Array, jax.Array]:
    """``spec.validate.check_model_kind`` and ``check_lm_batch`` on a host copy, then inputs ``tokens[:, :-1]``
    and targets ``tokens[:, 1:]`` as int32, padded to the forward's buckets: (Bb, Tb) twice."""
    config = model.config
    validate.check_model_kind(config, decoder_only=True)
    host = host_ids(tokens, config, "tokens")
    validate.check_lm_batch(host, config)
    ids = tokens if isinstance(tokens, jax.core.Tracer) else host
    Bb, Tb = shapes.batch_bucket(host.shape[0]), shapes.length_bucket(host.shape[1] - 1, config.max_len)
    return (device_ids(ids[:, :-1], Bb, Tb, config.pad_id),
            device_ids(ids[:, 1:], Bb, Tb, config.pad_id))


def _step(model: Module, state: TrainState, inputs: tuple[jax.Array, ...], tgt_out: jax.Array
          ) -> tuple[jax.Array, Module, TrainState]:
    """``train_step`` of either model on its validated, bucketed inputs and targets: the gradients by
    ``loss_and_gradients_program`` (``loss_and_gradients``' own program when the model draws no dropout), then
    Adam by ``adam_program``, compiled once whatever the shape. The dropout key is split off whether or not it is
    used, so the state's key does not depend on the rate."""
    check_state(model, state)
    rng, key = jax.random.split(state.rng)
    loss, grads = loss_and_gradients_program(model, inputs, tgt_out,
                                             jnp.asarray(state.train_config.label_smoothing, F32),
                                             key if model.config.dropout > 0.0 else None)
    model, new = adam_program(model, grads, state)
    order = list(state.m)  # the jitted function's dicts come back in sorted key order
    return loss, model, dataclasses.replace(new, m={n: new.m[n] for n in order}, v={n: new.v[n] for n in order},
                                            rng=rng)
