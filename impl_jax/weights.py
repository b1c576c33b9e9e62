"""Canonical weights (``spec.schema`` names, NumPy arrays, safetensors files) <-> ``Transformer`` or, for a
decoder-only config, ``LanguageModel``.

Everything goes through ``spec.weights_io``, so files and errors are the spec's. Arrays keep their stored dtype
(``config.param_dtype``; bf16 as ``ml_dtypes.bfloat16`` in NumPy, ``jnp.bfloat16`` on the device), so a load and a
save round-trip bit for bit.
"""

from __future__ import annotations

import os

import jax
import numpy as np

from impl_jax.layers import Module
from impl_jax.lm import LanguageModel
from impl_jax.model import Transformer
from spec import weights_io
from spec.config import Config
from spec.schema import param_specs


def from_params(config: Config, params: dict[str, np.ndarray]) -> Transformer | LanguageModel:
    """A model holding the canonical ``params`` (``spec.api``), checked by ``spec.weights_io.check_params``."""
    weights_io.check_params(config, params)
    return _model(config, params)


def params_of(model: Transformer | LanguageModel) -> dict[str, np.ndarray]:
    """The model's parameters as canonical ``{name: NumPy array}`` (``spec.api``); bf16 as ``ml_dtypes.bfloat16``."""
    return {name: np.asarray(x) for name, x in canonical(model).items()}


def load_weights(path: str | os.PathLike, config: Config | None = None) -> Transformer | LanguageModel:
    """A model from a canonical weights file (``spec.api``, ``spec.weights_io``)."""
    config, flat = weights_io.load_weights(path, config)
    return _model(config, flat)


def save_weights(model: Transformer | LanguageModel, path: str | os.PathLike) -> None:
    """Write the model's parameters and config as a canonical safetensors file, bit for bit (``spec.api``)."""
    weights_io.save_weights(path, model.config, params_of(model))


# The embedder's key paths -> canonical names (``impl_jax.layers.Embedder``'s fields are the reference's).
_EMBEDDER = {"embedder.table": "embedding", "embedder.positions": "position_embedding", "embedder.bias": "logits_bias"}


def canonical(tree: Module) -> dict[str, jax.Array]:
    """A model-shaped pytree (the model, its gradient) as ``{canonical name: leaf}`` in the order of
    ``spec.schema.param_specs``: the key paths are the canonical names, but for the embedder's (``_EMBEDDER``)."""
    order = {s.name: i for i, s in enumerate(param_specs(tree.config))}
    paths = ((jax.tree_util.keystr(path, simple=True, separator="."), x)
             for path, x in jax.tree_util.tree_leaves_with_path(tree))
    flat = {_EMBEDDER.get(path, path): x for path, x in paths}
    return dict(sorted(flat.items(), key=lambda item: order.get(item[0], len(order))))


def _model(config: Config, params: dict[str, np.ndarray]) -> Transformer | LanguageModel:
    """The model of ``config``'s kind holding checked canonical ``params``."""
    return (LanguageModel if config.decoder_only else Transformer)(config, params=params)
