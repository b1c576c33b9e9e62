"""Weights I/O in the canonical safetensors format (``spec.weights_io``): bf16 stored natively, bit-exact."""

from __future__ import annotations

import os

from impl_tf.model import Transformer
from spec import weights_io
from spec.config import Config


def load_weights(path: str | os.PathLike, config: Config | None = None) -> Transformer:
    """A Transformer from a canonical weights file, checked against ``config`` (default: the file's own).

    Raises:
        ValueError: naming the file if it is truncated or corrupt, or naming the tensor that is missing,
            unexpected, of the wrong shape or dtype, or non-finite (``spec.weights_io``).
    """
    return Transformer(*weights_io.load_weights(path, config))


def save_weights(model: Transformer, path: str | os.PathLike) -> None:
    """Write ``model``'s parameters and config to ``path``; ``load_weights`` reads back the same bits.

    Raises:
        ValueError: as ``spec.weights_io.check_params``.
    """
    weights_io.save_weights(path, model.config, {name: v.numpy() for name, v in model.parameters().items()})
