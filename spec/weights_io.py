"""Weights I/O in the canonical safetensors format (bf16 stored natively).

The file holds one tensor per name of ``spec.schema.param_specs(config)`` and
the config as JSON in the metadata key ``"config"``.
"""

from __future__ import annotations

import json
import os

import numpy as np
import safetensors
import safetensors.numpy

from spec.config import Config
from spec.numerics import np_dtype
from spec.schema import param_specs


def check_params(c: Config, params: dict[str, np.ndarray]) -> None:
    """Check ``params`` against the schema of ``c``.

    Raises:
        ValueError: naming the tensor that is missing, unexpected, of the wrong
            shape or dtype, or holds a non-finite value.
    """
    specs = {s.name: s for s in param_specs(c)}
    missing = [n for n in specs if n not in params]
    if missing:
        raise ValueError(f"missing parameter {missing[0]!r} ({len(missing)} missing in all)")
    unexpected = sorted(set(params) - set(specs))
    if unexpected:
        raise ValueError(f"unexpected parameter {unexpected[0]!r} ({len(unexpected)} unexpected in all)")
    for name, s in specs.items():
        a = params[name]
        if tuple(a.shape) != s.shape:
            raise ValueError(f"parameter {name!r}: expected shape {s.shape}, got {tuple(a.shape)}")
        if a.dtype != np_dtype(s.dtype):
            raise ValueError(f"parameter {name!r}: expected dtype {s.dtype}, got {a.dtype}")
        if not np.isfinite(a.astype(np.float32)).all():
            raise ValueError(f"parameter {name!r}: holds non-finite values")


def save_weights(path: str | os.PathLike, c: Config, params: dict[str, np.ndarray]) -> None:
    """Write ``params`` (checked against ``c``) and ``c`` to a safetensors file.

    Raises:
        ValueError: as ``check_params``.
    """
    check_params(c, params)
    tensors = {s.name: np.ascontiguousarray(params[s.name]) for s in param_specs(c)}
    safetensors.numpy.save_file(tensors, str(path), metadata={"config": c.to_json()})


def read_config(path: str | os.PathLike) -> Config:
    """The config stored in a weights file.

    Raises:
        ValueError: naming the file if it is unreadable, holds no config, or
            its config is not valid JSON or not a valid ``Config``.
    """
    try:
        with safetensors.safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
    except (OSError, safetensors.SafetensorError) as e:
        raise ValueError(f"{path}: not a readable safetensors file ({e})") from e
    if "config" not in meta:
        raise ValueError(f"{path}: no 'config' in the safetensors metadata")
    try:
        stored = json.loads(meta["config"])
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: the 'config' metadata is not valid JSON ({e})") from e
    if not isinstance(stored, dict):
        raise ValueError(f"{path}: the 'config' metadata is not a JSON object")
    try:
        return Config.from_dict(stored)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: invalid config in the metadata: {e}") from e


def load_weights(path: str | os.PathLike, c: Config | None = None) -> tuple[Config, dict[str, np.ndarray]]:
    """Read a weights file and check it against ``c`` (default: its stored config).

    Returns:
        ``(config, {name: array})`` with arrays in the stored dtypes.

    Raises:
        ValueError: naming the file if it is truncated or corrupt, or naming the
            tensor as ``check_params``.
    """
    stored = read_config(path)
    c = stored if c is None else c
    try:
        params = safetensors.numpy.load_file(str(path))
    except (OSError, safetensors.SafetensorError) as e:
        raise ValueError(f"{path}: corrupt safetensors file ({e})") from e
    check_params(c, params)
    return c, params


