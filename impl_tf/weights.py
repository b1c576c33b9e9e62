"""Canonical weights (``spec.schema`` names, NumPy arrays, safetensors files) <-> ``Transformer`` or, for a
decoder-only config, ``LanguageModel``.

Everything goes through ``spec.weights_io``, so files and errors are the spec's. Arrays keep their stored dtype
(``config.param_dtype``; bf16 as ``ml_dtypes.bfloat16`` in NumPy, ``tf.bfloat16`` in a variable), so a load and
a save round-trip bit for bit.
"""

from __future__ import annotations

import os

import numpy as np

from impl_tf.lm import LanguageModel, Model
from impl_tf.model import Transformer
from spec import weights_io
from spec.config import Config


def from_params(config: Config, params: dict[str, np.ndarray]) -> Model:
    """A model holding the canonical ``params`` ``{name: array}`` (``spec.schema`` names, ``config.param_dtype``):
    a ``LanguageModel`` for a decoder-only config, else a ``Transformer``.

    Raises:
        ValueError: from ``spec.weights_io.check_params``, naming the tensor that is missing, unexpected, of the
            wrong shape or dtype for ``config``, or non-finite.
    """
    weights_io.check_params(config, params)
    return _model(config, params)


def params_of(model: Model) -> dict[str, np.ndarray]:
    """The model's parameters as canonical ``{name: NumPy array}`` in their stored dtype (``config.param_dtype``;
    bf16 as ``ml_dtypes.bfloat16``), in the order of ``spec.schema.param_specs``."""
    return {name: v.numpy() for name, v in model.params.items()}


def load_weights(path: str | os.PathLike, config: Config | None = None) -> Model:
    """A model from a canonical weights file (``spec.weights_io``), as ``from_params``; ``config`` defaults to the
    stored one.

    A given config may differ from the stored one only where the weights do not depend on it
    (``spec.weights_io.config_for``; a ``UserWarning`` names the difference).

    Raises:
        ValueError: naming the file if it is truncated or corrupt, the config field the weights depend on if
            ``config`` differs there, or the tensor that is missing, unexpected, of the wrong shape or dtype, or
            non-finite.
    """
    config, params = weights_io.load_weights(path, config)
    return _model(config, params)


def save_weights(model: Model, path: str | os.PathLike) -> None:
    """Write the model's parameters and config to ``path`` as a canonical safetensors file, bit for bit.

    Raises:
        ValueError: as ``spec.weights_io.check_params`` (nothing is written then).
    """
    weights_io.save_weights(path, model.config, params_of(model))


def _model(config: Config, params: dict[str, np.ndarray]) -> Model:
    """The model of ``config``'s kind holding checked canonical ``params``."""
    return (LanguageModel if config.decoder_only else Transformer)(config, params=params)
