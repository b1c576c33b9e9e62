"""Weights I/O: the canonical safetensors file of ``spec.weights_io`` (bf16 stored natively), bit-exact both ways.

Reading and writing go through ``spec.weights_io`` so every backend raises the same ``ValueError`` for a
missing, unexpected, misshapen, mistyped or non-finite tensor, for a truncated or corrupt file, and for a given
config that the stored weights do not fit.
"""

from __future__ import annotations

import os

import numpy as np
import torch

import spec.weights_io
from impl_torch.layers import to_array
from impl_torch.lm import LanguageModel
from impl_torch.model import Transformer, TransformerBase
from spec.config import Config


def from_params(config: Config, params: dict[str, np.ndarray], *, device: torch.device | str | None = None,
                native_bf16: bool = False) -> Transformer | LanguageModel:
    """A model in eval mode on ``device`` (``native_bf16`` as ``Transformer``'s) holding the canonical ``params``
    of ``config``: {name: array} with the names, shapes and dtypes (``config.param_dtype``, bf16 as
    ``ml_dtypes.bfloat16``) of ``spec.schema``. A ``LanguageModel`` for a decoder-only config, else a
    ``Transformer``.

    Raises:
        ValueError: from ``spec.weights_io.check_params``, naming the offending tensor.
    """
    spec.weights_io.check_params(config, params)
    cls = LanguageModel if config.decoder_only else Transformer
    return cls(config, device=device, native_bf16=native_bf16, params=params).eval()


def params_of(model: TransformerBase) -> dict[str, np.ndarray]:
    """The model's parameters as canonical {name: NumPy array}: schema names and order, ``config.param_dtype``
    (bf16 as ``ml_dtypes.bfloat16``), the same bits."""
    return {name: to_array(t) for name, t in model.state_dict().items()}


def load_weights(path: str | os.PathLike, config: Config | None = None, *,
                 device: torch.device | str | None = None, native_bf16: bool = False) -> Transformer | LanguageModel:
    """Read a canonical weights file into a model in eval mode on ``device`` (``native_bf16`` as
    ``Transformer``'s): a ``LanguageModel`` for a decoder-only config, else a ``Transformer``.

    ``config`` defaults to the one stored in the file; a given one may differ from it only where the weights do
    not depend on it (``spec.weights_io.config_for``, which warns of the difference).

    Raises:
        ValueError: naming the file if truncated or corrupt, the field if ``config`` differs from the stored one
            where the weights depend on it, or the tensor that is missing, unexpected, of the wrong shape or
            dtype, or non-finite (``spec.weights_io.load_weights``).
    """
    config, params = spec.weights_io.load_weights(path, config)
    return from_params(config, params, device=device, native_bf16=native_bf16)


def save_weights(model: TransformerBase, path: str | os.PathLike) -> None:
    """Write the model's parameters and config to a canonical safetensors file, bit for bit.

    Raises:
        ValueError: from ``spec.weights_io.check_params`` (e.g. a non-finite parameter).
    """
    spec.weights_io.save_weights(path, model.config, params_of(model))
