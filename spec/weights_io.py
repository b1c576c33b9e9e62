"""Weights I/O in the canonical safetensors format (bf16 stored natively).

The file holds one tensor per name of ``spec.schema.param_specs(config)`` and
the config as JSON in the metadata key ``"config"``.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

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


def write_safetensors(path: str | os.PathLike, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    """A safetensors file that is the same bytes for the same tensors and metadata, created with the user's umask.

    safetensors writes its metadata keys in a per-process hash order and ``save_file`` creates files readable by
    their owner alone; so the header's metadata is put in key order here, and Python writes the file.
    """
    blob = safetensors.numpy.save(tensors, metadata=metadata)
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    if len(text) > n:  # the same keys and values in another order: never longer than safetensors' own
        raise RuntimeError(f"reordered safetensors header grew from {n} to {len(text)} bytes")
    Path(path).write_bytes(blob[:8] + text.ljust(n) + blob[8 + n:])


def save_weights(path: str | os.PathLike, c: Config, params: dict[str, np.ndarray]) -> None:
    """Write ``params`` (checked against ``c``) and ``c`` to a safetensors file.

    Raises:
        ValueError: as ``check_params``.
    """
    check_params(c, params)
    tensors = {s.name: np.ascontiguousarray(params[s.name]) for s in param_specs(c)}
    write_safetensors(path, tensors, {"config": c.to_json()})


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


# The fields the parameter set, shapes and dtypes depend on (``spec.schema``); the others (max_len, dropout,
# layer_norm_eps, token ids, dtype) change the computation but not the weights.
WEIGHT_FIELDS = ("vocab_size", "d_model", "n_heads", "d_k", "d_v", "d_ff", "n_encoder_layers", "n_decoder_layers",
                 "norm_first", "param_dtype")


def config_for(path: str | os.PathLike, stored: Config, c: Config | None) -> Config:
    """The config to build a model of the weights in ``path`` with: ``c`` if given, else ``stored``.

    A ``c`` that differs from ``stored`` only in fields the weights do not depend on is used, and the
    difference is stated in a ``UserWarning``.

    Raises:
        ValueError: naming the first field of ``WEIGHT_FIELDS`` in which ``c`` differs from ``stored``.
    """
    if c is None or c == stored:
        return stored
    differ = [f for f in stored.to_dict() if getattr(stored, f) != getattr(c, f)]
    for f in differ:
        if f in WEIGHT_FIELDS:
            raise ValueError(f"{path}: the given config has {f}={getattr(c, f)!r} but the weights were stored with "
                             f"{f}={getattr(stored, f)!r}; the weights depend on {f}")
    changes = ", ".join(f"{f} {getattr(stored, f)!r} -> {getattr(c, f)!r}" for f in differ)
    warnings.warn(f"{path}: using the given config, which differs from the stored one where the weights do not "
                  f"depend on it: {changes}", stacklevel=3)
    return c


def load_weights(path: str | os.PathLike, c: Config | None = None) -> tuple[Config, dict[str, np.ndarray]]:
    """Read a weights file and check it against ``c`` (default: its stored config; see ``config_for``).

    Returns:
        ``(config, {name: array})`` with arrays in the stored dtypes.

    Raises:
        ValueError: naming the file if it is truncated or corrupt, naming the field if ``c`` differs from the
            stored config where the weights depend on it, or naming the tensor as ``check_params``.
    """
    c = config_for(path, read_config(path), c)
    try:
        params = safetensors.numpy.load_file(str(path))
    except (OSError, safetensors.SafetensorError) as e:
        raise ValueError(f"{path}: corrupt safetensors file ({e})") from e
    check_params(c, params)
    return c, params


