"""The train state (sections 5.3, 5.4) and its file: what training carries from step to step besides the weights,
Adam's moments keyed by canonical name so that they save and load in every framework (``spec.train_state_io``).
``impl_torch.train`` runs the steps that update it.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import warnings

import torch
from torch import Tensor

from impl_torch.layers import to_array, to_tensor
from impl_torch.model import TransformerBase
from spec import train_state_io as spec_io
from spec import validate
from spec.training import TrainConfig


@dataclasses.dataclass
class TrainState:
    """What training carries from step to step besides the weights (sections 5.3, 5.4).

    ``step``: the updates done (0 at first); ``train_config``: the ``spec.training.TrainConfig``; ``m``, ``v``:
    Adam's first and second moments, {canonical name: float32 tensor of the parameter's shape} in ``spec.schema``
    order, on the model's device; ``rng``: the ``torch.Generator`` (on the model's device) that dropout masks are
    drawn from. ``train_step`` updates it in place.
    """

    step: int
    train_config: TrainConfig
    m: dict[str, Tensor]
    v: dict[str, Tensor]
    rng: torch.Generator


def init_train_state(model: TransformerBase, train_config: TrainConfig | None = None, seed: int = 0) -> TrainState:
    """A fresh train state for ``model``: zero fp32 moments, step 0, ``train_config`` (None: ``TrainConfig()``),
    the dropout generator seeded from ``seed`` (sections 5.3, 5.4).

    Raises:
        ValueError: if ``seed`` is not a non-negative int.
    """
    if not validate.is_int(seed) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    zeros = {name: torch.zeros(p.shape, dtype=torch.float32, device=p.device) for name, p in model.named_parameters()}
    return TrainState(step=0, train_config=TrainConfig() if train_config is None else train_config, m=zeros,
                      v={name: z.clone() for name, z in zeros.items()},
                      rng=torch.Generator(device=model.embedding.device).manual_seed(int(seed)))


def save_train_state(state: TrainState, path: str | os.PathLike) -> None:
    """Write ``state`` in the canonical format of ``spec.train_state_io``: the moments as "m.<name>", "v.<name>"
    float32, step and config, and the generator's state as "rng" (framework "torch")."""
    spec_io.save(path, spec_io.StoredState({k: to_array(t) for k, t in state.m.items()},
                                           {k: to_array(t) for k, t in state.v.items()}, state.step,
                                           state.train_config, state.rng.get_state().numpy(), "torch"))


def load_train_state(path: str | os.PathLike, model: TransformerBase) -> TrainState:
    """The state ``save_train_state`` wrote, bit for bit, checked against ``model``'s parameter names and shapes.

    A file written by another framework (or for another device's generator) keeps its moments, step and config;
    its dropout generator is seeded afresh from 0, with a ``UserWarning`` that dropout masks will differ.

    Raises:
        ValueError: from ``spec.train_state_io.load``: naming the file if it is unreadable or its metadata invalid,
            or naming the first moment that is missing, unexpected, or of the wrong shape or dtype for ``model``.
    """
    stored = spec_io.load(path, model.config)
    device = model.embedding.device
    moments = [{name: to_tensor(a).to(device) for name, a in getattr(stored, k).items()} for k in ("m", "v")]
    rng = torch.Generator(device=device).manual_seed(0)
    if stored.framework == "torch" and stored.rng.shape == tuple(rng.get_state().shape):
        rng.set_state(torch.from_numpy(stored.rng))
    else:
        warnings.warn(f"{path}: a train state of framework {stored.framework!r} with another dropout RNG; its "
                      f"moments, step and config are kept, the RNG is seeded afresh from 0, so dropout masks will "
                      f"differ", stacklevel=2)
    return TrainState(step=stored.step, train_config=stored.train_config, m=moments[0], v=moments[1], rng=rng)


def check_state(model: TransformerBase, state: TrainState) -> None:
    """``state``'s moments must have the model's parameter names, in order, and shapes.

    Raises:
        ValueError: naming the first moment whose name or shape is not the model's parameter's.
    """
    names = [name for name, _ in model.named_parameters()]
    for k in ("m", "v"):
        for i, (have, want) in enumerate(itertools.zip_longest(getattr(state, k), names)):
            if have != want:
                raise ValueError(f"train state: {k}'s parameter {i} is {have!r}, the model's is {want!r}")
    for name, p in model.named_parameters():
        for k in ("m", "v"):
            if getattr(state, k)[name].shape != p.shape:
                raise ValueError(f"train state: {k}.{name} has shape {tuple(getattr(state, k)[name].shape)}, "
                                 f"the parameter {tuple(p.shape)}")
