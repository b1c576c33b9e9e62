"""Canonical weights (``spec.schema`` names, NumPy arrays, safetensors files) <-> ``Transformer``.

Everything goes through ``spec.weights_io``, so files and errors are the spec's.
Arrays keep their stored dtype (``config.param_dtype``; bf16 as
``ml_dtypes.bfloat16`` in NumPy, ``jnp.bfloat16`` on the device), so a load and a
save round-trip bit for bit.
"""

from __future__ import annotations

import os

import jax
import numpy as np

from impl_jax.model import Params, Transformer, to_tree
from spec import weights_io
from spec.config import Config
from spec.schema import param_specs


def from_params(config: Config, params: dict[str, np.ndarray]) -> Transformer:
    """A model holding the canonical ``params`` ``{name: array}`` (``spec.schema`` names, ``config.param_dtype``).

    Raises:
        ValueError: from ``spec.weights_io.check_params``, naming the tensor that is missing,
            unexpected, of the wrong shape or dtype for ``config``, or non-finite.
    """
    weights_io.check_params(config, params)
    return Transformer._of(config, to_tree(params))


def params_of(model: Transformer) -> dict[str, np.ndarray]:
    """The model's parameters as canonical ``{name: NumPy array}`` in their stored dtype
    (``config.param_dtype``; bf16 as ``ml_dtypes.bfloat16``), in the order of ``spec.schema.param_specs``.

    Every leaf of ``model.params`` is named, so a tree changed by hand keeps its extra or missing
    names for ``save_weights`` to report (``spec.weights_io.check_params``); names outside the schema
    come last.
    """
    return {name: np.asarray(x) for name, x in canonical(model.params, model.config).items()}


def canonical(tree: Params, config: Config | None) -> dict[str, jax.Array]:
    """A parameter-shaped pytree (parameters, gradients, Adam's moments) as ``{canonical name: leaf}``, in the
    order of ``spec.schema.param_specs`` of ``config`` (names outside it last), or in the tree's order if None."""
    order = {s.name: i for i, s in enumerate(param_specs(config))} if config is not None else {}
    flat = {".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): x
            for path, x in jax.tree_util.tree_leaves_with_path(tree)}
    return dict(sorted(flat.items(), key=lambda item: order.get(item[0], len(order))))


def load_weights(path: str | os.PathLike, config: Config | None = None) -> Transformer:
    """A model from a canonical weights file (``spec.weights_io``); ``config`` defaults to the stored one.

    A given config may differ from the stored one only where the weights do not
    depend on it (``spec.weights_io.config_for``; a ``UserWarning`` names the difference).

    Raises:
        ValueError: naming the file if truncated or corrupt, the config field the
            weights depend on if ``config`` differs there, or the tensor that is
            missing, unexpected, of the wrong shape or dtype, or non-finite.
    """
    config, flat = weights_io.load_weights(path, config)
    return Transformer._of(config, to_tree(flat))


def save_weights(model: Transformer, path: str | os.PathLike) -> None:
    """Write the model's parameters and config as a canonical safetensors file, bit for bit.

    Raises:
        ValueError: as ``spec.weights_io.check_params`` (nothing is written then).
    """
    weights_io.save_weights(path, model.config, params_of(model))
