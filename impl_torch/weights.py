"""Weights I/O: the canonical safetensors file of ``spec.weights_io`` (bf16 stored natively), bit-exact both ways.

Reading and writing go through ``spec.weights_io`` so every backend raises the same ``ValueError`` for a
missing, unexpected, misshapen, mistyped or non-finite tensor, and for a truncated or corrupt file.
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import torch

import spec.weights_io
from impl_torch.model import Transformer
from spec.config import Config


def to_tensor(a: np.ndarray) -> torch.Tensor:
    """A NumPy array (bf16 as ``ml_dtypes.bfloat16``) as a CPU tensor with the same bits."""
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)  # NumPy has no bf16
    return torch.from_numpy(np.ascontiguousarray(a))


def to_array(t: torch.Tensor) -> np.ndarray:
    """A tensor as a NumPy array with the same bits (bf16 as ``ml_dtypes.bfloat16``)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def from_params(config: Config, params: dict[str, np.ndarray], device: torch.device | str | None = None
                ) -> Transformer:
    """A Transformer in eval mode holding the canonical ``params`` ({name: array}) of ``config``.

    Raises:
        ValueError: from ``spec.weights_io.check_params``, naming the offending tensor.
    """
    spec.weights_io.check_params(config, params)
    model = Transformer(config, device=device)
    model.load_state_dict({name: to_tensor(a) for name, a in params.items()})
    return model.eval()


def params_of(model: Transformer) -> dict[str, np.ndarray]:
    """The model's canonical parameters as NumPy arrays, in schema order."""
    return {name: to_array(t) for name, t in model.state_dict().items()}


def load_weights(path: str | os.PathLike, device: torch.device | str | None = None,
                 config: Config | None = None) -> Transformer:
    """Read a canonical weights file into a Transformer (eval mode) on ``device``.

    ``config`` defaults to the one stored in the file.

    Raises:
        ValueError: naming the file if truncated or corrupt, or the tensor that is missing, unexpected, of the
            wrong shape or dtype, or non-finite (``spec.weights_io.load_weights``).
    """
    config, params = spec.weights_io.load_weights(path, config)
    return from_params(config, params, device)


def save_weights(model: Transformer, path: str | os.PathLike) -> None:
    """Write the model's parameters and config to a canonical safetensors file, bit for bit.

    Raises:
        ValueError: from ``spec.weights_io.check_params`` (e.g. a non-finite parameter).
    """
    spec.weights_io.save_weights(path, model.config, params_of(model))
