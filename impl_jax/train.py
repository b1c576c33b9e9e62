"""Training as the paper did it (section 5): the label-smoothed loss, Adam with the warmup schedule, dropout.

The definitions are ``spec.training``'s, as pure functions jitted once per shape bucket:

* The forward is the model's own (``impl_jax.model.teacher_forced``, the numerics contract exactly as in evaluation),
  with dropout from a PRNG key split off the state's; the loss is computed in fp32 from the float32 logits.
* ``jax.value_and_grad`` differentiates with respect to fp32 copies of the parameters, so gradients are fp32 whatever
  ``param_dtype``; the rounding of a weight to ``config.dtype`` passes its gradient through unchanged (``_rounded``),
  where autodiff of ``astype`` would round the gradient to bf16.
* Adam is ``optax.scale_by_adam`` (eps outside the square root of the bias-corrected second moment, as
  ``spec.training``) over fp32 moments and fp32 gradients, times the learning rate of equation 3; each updated
  parameter is computed in fp32 and rounded once to ``param_dtype``. ``optax.adam`` itself would keep the second
  moment in the parameters' dtype (``mu_dtype`` covers only the first), bf16 for a pure-bf16 model.

Shapes: as ``impl_jax.model.forward``, the batch and the lengths are padded to buckets (``spec.shapes``), targets
with ``pad_id``. Padded targets count neither in the loss nor in its denominator, and padded source keys get exactly
zero weight, so loss and gradients are the batch's own (up to the order of fp32 sums) while a stream of batch shapes
compiles a bounded number of programs, each logged once at INFO on the ``"impl_jax"`` logger.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax

from impl_jax import layers
from impl_jax.model import Ids, Params, Transformer, host_ids, log, padded_ids, teacher_forced, to_tree
from impl_jax.weights import canonical
from spec import shapes, validate
from spec import train_state_io as spec_io
from spec.config import Config
from spec.recording import recording
from spec.training import TrainConfig

F32 = jnp.float32
SEED_LIMIT = 2 ** 32  # jax.random.key keeps only the low 32 bits of a seed without jax_enable_x64


@functools.partial(jax.tree_util.register_dataclass, data_fields=["m", "v", "step", "rng"],
                   meta_fields=["train_config"])
@dataclasses.dataclass(frozen=True)
class TrainState:
    """What training carries from step to step besides the weights (sections 5.3, 5.4), a pytree.

    ``m``, ``v``: Adam's first and second moments, {canonical name: float32 array of the parameter's shape} in
    ``spec.schema`` order; ``step``: () int32, the updates done (0 at first); ``rng``: the JAX PRNG key that dropout
    masks are split from; ``train_config``: the ``spec.training.TrainConfig`` (static aux data). Immutable:
    ``train_step`` returns a new one.
    """

    m: dict[str, jax.Array]
    v: dict[str, jax.Array]
    step: jax.Array
    rng: jax.Array
    train_config: TrainConfig


def init_train_state(model: Transformer, train_config: TrainConfig | None = None, seed: int = 0) -> TrainState:
    """A fresh train state for ``model``: zero fp32 moments, step 0, ``train_config`` (None: ``TrainConfig()``),
    the dropout key ``jax.random.key(seed)`` (sections 5.3, 5.4).

    Raises:
        ValueError: if ``seed`` is not a non-negative int below 2**32 (a JAX seed without 64-bit mode).
    """
    if not validate.is_int(seed) or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed must be a non-negative int below 2**32, got {seed!r}")
    zeros = {name: jnp.zeros(p.shape, F32) for name, p in canonical(model.params, model.config).items()}
    return TrainState(m=zeros, v=dict(zeros), step=jnp.zeros((), jnp.int32), rng=jax.random.key(int(seed)),
                      train_config=TrainConfig() if train_config is None else train_config)


def loss_and_gradients(model: Transformer, src: Ids, tgt_in: Ids, tgt_out: Ids, label_smoothing: float = 0.1
                       ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The label-smoothed loss of ``spec.training`` (section 5.4) and its gradient, in evaluation mode (no dropout).

    src (B, S), tgt_in (B, T), tgt_out (B, T) int ids. Returns (loss, a () float32 array; {canonical name: float32
    gradient of the parameter's shape} in ``spec.schema`` order). For fp32 parameters computing in bf16 these are
    the gradients of the fp32 master weights; for bf16 parameters, of their (exact) fp32 values.

    Raises:
        ValueError: from ``spec.validate.check_forward`` and ``check_tokens("tgt_out", ...)``, if tgt_out's shape
            differs from tgt_in's, or if every target is ``pad_id``; before anything is computed.
    """
    batch = _batch(model.config, src, tgt_in, tgt_out)
    loss, grads = _loss_and_gradients_jit(model.params, *batch, model.config, jnp.asarray(label_smoothing, F32))
    return loss, canonical(grads, model.config)


def train_step(model: Transformer, state: TrainState, src: Ids, tgt_in: Ids, tgt_out: Ids
               ) -> tuple[jax.Array, Transformer, TrainState]:
    """One Adam step on one batch in training mode (sections 5.3, 5.4): -> (loss, new model, new state).

    src (B, S), tgt_in (B, T), tgt_out (B, T) int ids. Dropout at ``config.dropout`` with masks from a key split
    off ``state.rng``; the loss as ``loss_and_gradients`` (label smoothing of ``state.train_config``), a () float32
    array, the batch's before the update; Adam's moments and update in fp32 with the learning rate of equation 3 at
    step ``state.step + 1``; each parameter rounded to ``config.param_dtype``. Computes from ``model.params`` as
    they are; go on with the returned model and state (the ones passed in are left unchanged).

    Raises:
        ValueError: as ``loss_and_gradients``, or if ``state`` was built for another model (parameter names or
            shapes); before anything is computed.
    """
    batch = _batch(model.config, src, tgt_in, tgt_out)
    _check_state(model, state)
    loss, params, m, v, step, rng = _train_step_jit(model.params, state.m, state.v, state.step, state.rng, *batch,
                                                    model.config, state.train_config)
    order = list(state.m)  # the jitted function's dicts come back in sorted key order
    state = TrainState(m={n: m[n] for n in order}, v={n: v[n] for n in order}, step=step, rng=rng,
                       train_config=state.train_config)
    return loss, Transformer._of(model.config, params), state


def save_train_state(state: TrainState, path: str | os.PathLike) -> None:
    """Write ``state`` in the canonical format of ``spec.train_state_io``: the moments as "m.<name>", "v.<name>"
    float32, step and config, and the key's data as "rng" (framework "jax")."""
    spec_io.save(path, spec_io.StoredState({k: np.asarray(x) for k, x in state.m.items()},
                                           {k: np.asarray(x) for k, x in state.v.items()}, int(state.step),
                                           state.train_config, np.asarray(jax.random.key_data(state.rng)), "jax"))


def load_train_state(path: str | os.PathLike, model: Transformer) -> TrainState:
    """The state ``save_train_state`` wrote, bit for bit, checked against ``model``'s parameter names and shapes.

    A file written by another framework keeps its moments, step and config (canonical); its dropout key is
    ``jax.random.key(0)``, with a ``UserWarning`` that dropout masks will differ.

    Raises:
        ValueError: from ``spec.train_state_io.load``: naming the file if it is unreadable or its metadata invalid,
            or naming the first moment that is missing, unexpected, or of the wrong shape or dtype for ``model``;
            or if the step does not fit JAX's int32.
    """
    stored = spec_io.load(path, model.config)
    if stored.step >= 2 ** 31:
        raise ValueError(f"{path}: step must lie in [0, 2**31), got {stored.step}")
    m, v = ({name: jnp.asarray(x) for name, x in getattr(stored, k).items()} for k in ("m", "v"))
    return TrainState(m=m, v=v, step=jnp.asarray(stored.step, jnp.int32), rng=_stored_key(path, stored),
                      train_config=stored.train_config)


# ----------------------------------------------------------------- internals

def _batch(config: Config, src: Ids, tgt_in: Ids, tgt_out: Ids) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``spec.validate.check_train_batch`` on host copies, then the ids as int32, padded to the forward's buckets:
    (Bb, Sb), (Bb, Tb) twice."""
    src_host, tgt_host, out_host = (host_ids(x, config) for x in (src, tgt_in, tgt_out))
    validate.check_train_batch(src_host, tgt_host, out_host, config)
    (B, S), T = src_host.shape, tgt_host.shape[1]
    Bb, Tb = shapes.batch_bucket(B), shapes.length_bucket(T, config.max_len)
    return (padded_ids(src, src_host, Bb, shapes.length_bucket(S, config.max_len), config.pad_id),  # (Bb, Sb)
            padded_ids(tgt_in, tgt_host, Bb, Tb, config.pad_id),                                  # (Bb, Tb)
            padded_ids(tgt_out, out_host, Bb, Tb, config.pad_id))                                 # (Bb, Tb)


def _check_state(model: Transformer, state: TrainState) -> None:
    """``state``'s moments must have the model's parameter names and shapes."""
    want = {name: tuple(p.shape) for name, p in canonical(model.params, model.config).items()}
    for k in ("m", "v"):
        have = {name: tuple(x.shape) for name, x in getattr(state, k).items()}
        for name in [*want, *have]:
            if name not in have:
                raise ValueError(f"train state: no {k}.{name} for the model's parameter {name!r}")
            if name not in want:
                raise ValueError(f"train state: {k}.{name} is not a parameter of the model")
            if have[name] != want[name]:
                raise ValueError(f"train state: {k}.{name} has shape {have[name]}, the parameter {want[name]}")


def _stored_key(path: str | os.PathLike, stored: spec_io.StoredState) -> jax.Array:
    """The file's JAX key, bit for bit; for another framework's RNG state (or key data this JAX's default PRNG
    cannot wrap) ``jax.random.key(0)`` and a ``UserWarning``."""
    if stored.framework == "jax":
        try:
            return jax.random.wrap_key_data(jnp.asarray(stored.rng))
        except (TypeError, ValueError):
            pass  # another PRNG implementation's key data
    warnings.warn(f"{path}: a train state of framework {stored.framework!r} with another dropout RNG; its moments, "
                  f"step and config are kept, the RNG is seeded afresh from 0, so dropout masks will differ",
                  stacklevel=3)
    return jax.random.key(0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _rounded(p: jax.Array, dtype: str) -> jax.Array:
    """fp32 ``p`` rounded to ``dtype`` and held in fp32 (``impl_jax.model.weights_f32``, rule 0), with the
    identity as its gradient: the master weight's gradient is the rounded weight's (``spec.training``)."""
    return p.astype(dtype).astype(F32)


def _rounded_fwd(p: jax.Array, dtype: str) -> tuple[jax.Array, None]:
    return _rounded(p, dtype), None


def _rounded_bwd(dtype: str, _: None, g: jax.Array) -> tuple[jax.Array]:
    return (g,)


_rounded.defvjp(_rounded_fwd, _rounded_bwd)


def _loss(params32: Params, src: jax.Array, tgt_in: jax.Array, tgt_out: jax.Array, config: Config,
          label_smoothing: jax.Array | float, key: jax.Array | None) -> jax.Array:
    """The smoothed loss of fp32 parameters (section 5.4): src (B, S), tgt_in and tgt_out (B, T) -> () float32.

    The forward runs on the weights rounded to ``config.dtype`` and held in fp32, as ``Transformer.__call__`` does
    (bit for bit what the ``config.dtype`` weights compute); its records go to a dict of this trace's own.
    """
    with recording():
        logits = teacher_forced(jax.tree.map(lambda p: _rounded(p, config.dtype), params32), src, tgt_in, config,
                                key)                                                   # (B, T, V) float32
    q = optax.smooth_labels(jax.nn.one_hot(tgt_out, config.vocab_size, dtype=F32), label_smoothing)  # (B, T, V)
    per_token = optax.softmax_cross_entropy(logits, q)                                 # (B, T) float32
    weight = (tgt_out != config.pad_id).astype(F32)                                    # (B, T): padding counts not
    return (per_token * weight).sum() / weight.sum()                                   # () mean over non-pad


def _value_and_grad(params: Params, src: jax.Array, tgt_in: jax.Array, tgt_out: jax.Array, config: Config,
                    label_smoothing: jax.Array | float, key: jax.Array | None) -> tuple[jax.Array, Params]:
    """(loss () float32, gradient tree float32) at ``params`` upcast to fp32 (exact): master-weight gradients."""
    params32 = jax.tree.map(lambda p: p.astype(F32), params)
    return jax.value_and_grad(_loss)(params32, src, tgt_in, tgt_out, config, label_smoothing, key)


def _learning_rate(step: jax.Array, d_model: int, warmup_steps: int, scale: float) -> jax.Array:
    """Equation 3 times ``scale``, ``spec.training.learning_rate``, of a traced int step >= 1: () float32."""
    t = step.astype(F32)
    return scale * d_model ** -0.5 * jnp.minimum(t ** -0.5, t * warmup_steps ** -1.5)


@functools.partial(layers.jit, static_argnames=("config",))
def _loss_and_gradients_jit(params: Params, src: jax.Array, tgt_in: jax.Array, tgt_out: jax.Array, config: Config,
                            label_smoothing: jax.Array) -> tuple[jax.Array, Params]:
    log.info("impl_jax: compiling loss_and_gradients for batch %d, source length %d, target length %d (buckets)",
             *src.shape, tgt_in.shape[1])
    return _value_and_grad(params, src, tgt_in, tgt_out, config, label_smoothing, None)


@functools.partial(layers.jit, static_argnames=("config", "train_config"))
def _train_step_jit(params: Params, m: dict[str, jax.Array], v: dict[str, jax.Array], step: jax.Array,
                    rng: jax.Array, src: jax.Array, tgt_in: jax.Array, tgt_out: jax.Array, config: Config,
                    train_config: TrainConfig):
    """-> (loss, new params tree, m, v, step, rng): one step of ``train_step`` on validated, bucketed ids."""
    log.info("impl_jax: compiling train_step for batch %d, source length %d, target length %d (buckets)",
             *src.shape, tgt_in.shape[1])
    loss, _, *updated = _adam_step(params, m, v, step, rng, src, tgt_in, tgt_out, config, train_config)
    return loss, *updated


def _adam_step(params: Params, m: dict[str, jax.Array], v: dict[str, jax.Array], step: jax.Array, rng: jax.Array,
               src: jax.Array, tgt_in: jax.Array, tgt_out: jax.Array, config: Config, train_config: TrainConfig):
    """-> (loss, {canonical name: fp32 gradient}, new params tree, m, v, step, rng): the traced body of one
    ``train_step``; the gradient is the one the update used (``impl_jax.train_dp`` returns it, this module drops it,
    and XLA with it)."""
    tc = train_config
    rng, key = jax.random.split(rng)
    loss, grads = _value_and_grad(params, src, tgt_in, tgt_out, config, tc.label_smoothing, key)
    grads = canonical(grads, config)                                          # {name: fp32 gradient}
    adam = optax.scale_by_adam(b1=tc.beta1, b2=tc.beta2, eps=tc.adam_eps)
    updates, adam_state = adam.update(grads, optax.ScaleByAdamState(step, m, v))  # fp32
    lr = _learning_rate(adam_state.count, config.d_model, tc.warmup_steps, tc.lr_scale)  # at step + 1
    new = {name: (p.astype(F32) - lr * updates[name]).astype(p.dtype)         # fp32 update, rounded once
           for name, p in canonical(params, config).items()}
    return loss, grads, to_tree(new), adam_state.mu, adam_state.nu, adam_state.count, rng
