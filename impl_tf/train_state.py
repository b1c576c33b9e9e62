"""The train state (sections 5.3, 5.4) and its file: what training carries from step to step besides the weights,
Adam's moments keyed by canonical name so that they save and load in every framework (``spec.train_state_io``).
``impl_tf.train`` runs the steps that update it.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import warnings

import numpy as np
import tensorflow as tf

from impl_tf.lm import Model
from spec import train_state_io as spec_io
from spec import validate
from spec.training import TrainConfig


@dataclasses.dataclass
class TrainState:
    """What training carries from step to step besides the weights (sections 5.3, 5.4).

    ``step``: an int64 ``tf.Variable``, the updates done (0 at first); ``train_config``: the
    ``spec.training.TrainConfig``; ``m``, ``v``: Adam's first and second moments, {canonical name: float32
    ``tf.Variable`` of the parameter's shape} in ``spec.schema`` order; ``rng``: the ``tf.random.Generator``
    (Philox) that each step's dropout seed is drawn from. ``train_step`` updates it in place.
    """

    step: tf.Variable
    train_config: TrainConfig
    m: dict[str, tf.Variable]
    v: dict[str, tf.Variable]
    rng: tf.random.Generator


def init_train_state(model: Model, train_config: TrainConfig | None = None, seed: int = 0) -> TrainState:
    """The dropout generator is ``tf.random.Generator.from_seed(seed, alg="philox")``; all variables are made in
    the caller's ``tf.distribute`` scope, if any."""
    if not validate.is_int(seed) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    moments = lambda k: {name: tf.Variable(tf.zeros(p.shape, tf.float32), trainable=False, name=f"{k}.{name}")  # noqa: E731
                         for name, p in model.params.items()}
    return TrainState(tf.Variable(0, dtype=tf.int64, trainable=False, name="step"),
                      TrainConfig() if train_config is None else train_config, moments("m"), moments("v"),
                      tf.random.Generator.from_seed(int(seed), alg="philox"))


def save_train_state(state: TrainState, path: str | os.PathLike) -> None:
    """The generator's Philox state is stored as "rng" (int64 (3,), framework "tf"). The variables may be mirrored
    (``impl_tf.train_dp``): the first device's copy is written."""
    spec_io.save(path, spec_io.StoredState({k: x.numpy() for k, x in state.m.items()},
                                           {k: x.numpy() for k, x in state.v.items()}, int(state.step.numpy()),
                                           state.train_config, state.rng.state.numpy(), "tf"))


def load_train_state(path: str | os.PathLike, model: Model) -> TrainState:
    """A file written by another framework keeps its moments, step and config; its dropout generator is seeded
    afresh from 0, with a ``UserWarning`` that dropout masks will differ."""
    stored = spec_io.load(path, model.config)
    state = init_train_state(model, stored.train_config, 0)
    if stored.framework == "tf" and stored.rng.dtype == np.int64 and stored.rng.shape == tuple(state.rng.state.shape):
        state.rng = tf.random.Generator.from_state(stored.rng, alg="philox")
    else:
        warnings.warn(f"{path}: a train state of framework {stored.framework!r} with another dropout RNG; its "
                      f"moments, step and config are kept, the RNG is seeded afresh from 0, so dropout masks will "
                      f"differ", stacklevel=2)
    for name in model.params:
        state.m[name].assign(stored.m[name])
        state.v[name].assign(stored.v[name])
    state.step.assign(stored.step)
    return state


def check_state(model: Model, state: TrainState) -> None:
    """``state``'s moments must have the model's parameter names, in its order, and shapes.

    Raises:
        ValueError: naming the first moment whose name or shape is not the model's parameter's.
    """
    for k in ("m", "v"):
        moments = getattr(state, k)
        for i, (have, want) in enumerate(itertools.zip_longest(moments, model.params)):
            if have != want:
                raise ValueError(f"train state: {k}'s parameter {i} is {have!r}, the model's is {want!r}")
            if moments[have].shape != model.params[want].shape:
                raise ValueError(f"train state: {k}.{have} has shape {tuple(moments[have].shape)}, the parameter "
                                 f"{tuple(model.params[want].shape)}")
