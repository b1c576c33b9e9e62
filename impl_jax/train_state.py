"""The train state (sections 5.3, 5.4) and its file: what training carries from step to step besides the weights,
Adam's moments keyed by canonical name so that they save and load in every framework (``spec.train_state_io``).
``impl_jax.train`` runs the steps that update it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from impl_jax.layers import Module
from impl_jax.lm import LanguageModel
from impl_jax.model import Transformer
from impl_jax.weights import canonical
from spec import train_state_io as spec_io
from spec import validate
from spec.training import TrainConfig

F32 = jnp.float32
SEED_LIMIT = 2 ** 32  # jax.random.key keeps only the low 32 bits of a seed without jax_enable_x64


@functools.partial(jax.tree_util.register_dataclass, data_fields=["step", "m", "v", "rng"],
                   meta_fields=["train_config"])
@dataclasses.dataclass(frozen=True)
class TrainState:
    """What training carries from step to step besides the weights (``spec.api``; sections 5.3, 5.4), a pytree:
    ``step`` () int32, ``train_config`` (static aux data), Adam's fp32 moments ``m`` and ``v`` {canonical name:
    array} in ``spec.schema`` order, and ``rng``, the JAX PRNG key that dropout keys are split from. Immutable:
    ``train_step`` returns a new one."""

    step: jax.Array
    train_config: TrainConfig
    m: dict[str, jax.Array]
    v: dict[str, jax.Array]
    rng: jax.Array


def init_train_state(model: Transformer | LanguageModel, train_config: TrainConfig | None = None, seed: int = 0
                     ) -> TrainState:
    """A fresh train state (``spec.api``); the dropout key ``jax.random.key(seed)``, ``seed`` below 2**32 (a JAX
    seed without 64-bit mode)."""
    if not validate.is_int(seed) or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed must be a non-negative int below 2**32, got {seed!r}")
    zeros = {name: jnp.zeros(p.shape, F32) for name, p in canonical(model).items()}
    return TrainState(step=jnp.zeros((), jnp.int32),
                      train_config=TrainConfig() if train_config is None else train_config,
                      m=zeros, v=dict(zeros), rng=jax.random.key(int(seed)))


def save_train_state(state: TrainState, path: str | os.PathLike) -> None:
    """Write ``state`` as ``spec.train_state_io`` (``spec.api``); the key's data as "rng" (framework "jax")."""
    spec_io.save(path, spec_io.StoredState({k: np.asarray(x) for k, x in state.m.items()},
                                           {k: np.asarray(x) for k, x in state.v.items()}, int(state.step),
                                           state.train_config, np.asarray(jax.random.key_data(state.rng)), "jax"))


def load_train_state(path: str | os.PathLike, model: Transformer | LanguageModel) -> TrainState:
    """The state ``save_train_state`` wrote, bit for bit (``spec.api``). Another framework's file (or key data this
    JAX's default PRNG cannot wrap) gets ``jax.random.key(0)`` and a ``UserWarning``; a step beyond int32 raises."""
    stored = spec_io.load(path, model.config)
    if stored.step >= 2 ** 31:
        raise ValueError(f"{path}: step must lie in [0, 2**31), got {stored.step}")
    m, v = ({name: jnp.asarray(x) for name, x in getattr(stored, k).items()} for k in ("m", "v"))
    rng = None
    if stored.framework == "jax":
        try:
            rng = jax.random.wrap_key_data(jnp.asarray(stored.rng))
        except (TypeError, ValueError):
            pass  # another PRNG implementation's key data
    if rng is None:
        warnings.warn(f"{path}: a train state of framework {stored.framework!r} with another dropout RNG; its "
                      f"moments, step and config are kept, the RNG is seeded afresh from 0, so dropout masks will "
                      f"differ", stacklevel=2)
        rng = jax.random.key(0)
    return TrainState(step=jnp.asarray(stored.step, jnp.int32), train_config=stored.train_config, m=m, v=v, rng=rng)


def check_state(model: Module, state: TrainState) -> None:
    """``state``'s moments must have the model's parameter names and shapes.

    Raises:
        ValueError: naming the first moment that is missing, not a parameter of the model, or of another shape.
    """
    want = {name: tuple(p.shape) for name, p in canonical(model).items()}
    for k in ("m", "v"):
        have = {name: tuple(x.shape) for name, x in getattr(state, k).items()}
        for name in [*want, *have]:
            if name not in have:
                raise ValueError(f"train state: no {k}.{name} for the model's parameter {name!r}")
            if name not in want:
                raise ValueError(f"train state: {k}.{name} is not a parameter of the model")
            if have[name] != want[name]:
                raise ValueError(f"train state: {k}.{name} has shape {have[name]}, the parameter {want[name]}")
