"""Train-state I/O in one canonical safetensors format, written and read the same way by every impl.

The file holds Adam's moments as ``m.<name>`` and ``v.<name>`` (float32, one per name of
``spec.schema.param_specs``), the dropout RNG's state as ``rng`` (the framework's own bytes), and the metadata
``step`` (updates done), ``train_config`` (JSON of the ``spec.training.TrainConfig`` fields) and ``framework``.
Moments, step and config are canonical: a file written by one impl resumes training in another; the RNG state is
only meaningful to the framework that wrote it (``load`` reports whose it is).
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import safetensors
import safetensors.numpy

from spec import weights_io
from spec.config import Config
from spec.schema import param_specs
from spec.training import TrainConfig


@dataclasses.dataclass
class StoredState:
    """What a train-state file holds: moments {name: float32 array} in schema order, step, config, RNG bytes and
    the framework that wrote them."""

    m: dict[str, np.ndarray]
    v: dict[str, np.ndarray]
    step: int
    train_config: TrainConfig
    rng: np.ndarray
    framework: str


def save(path: str | os.PathLike, state: StoredState) -> None:
    """Write ``state`` (moments as float32 NumPy arrays keyed by canonical name)."""
    tensors = {f"{k}.{name}": np.ascontiguousarray(a, np.float32) for k in ("m", "v")
               for name, a in getattr(state, k).items()}
    tensors["rng"] = np.ascontiguousarray(state.rng)
    meta = {"step": str(state.step), "train_config": json.dumps(dataclasses.asdict(state.train_config)),
            "framework": state.framework}
    weights_io.write_safetensors(path, tensors, meta)


def load(path: str | os.PathLike, c: Config) -> StoredState:
    """Read a train-state file for a model of config ``c``.

    Raises:
        ValueError: naming the file if it is unreadable or its metadata invalid, or naming the first moment that is
            missing, unexpected, or not float32 of the parameter's shape.
    """
    try:
        with safetensors.safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
        arrays = safetensors.numpy.load_file(str(path))
        step, tc = int(meta["step"]), TrainConfig(**json.loads(meta["train_config"]))
    except (OSError, safetensors.SafetensorError, KeyError, TypeError, ValueError) as e:  # JSONDecodeError too
        raise ValueError(f"{path}: not a train state file ({e!r})") from e
    if step < 0:
        raise ValueError(f"{path}: step must be >= 0, got {step}")
    shapes = {s.name: s.shape for s in param_specs(c)}
    for key, shape in ((f"{k}.{name}", shape) for k in ("m", "v") for name, shape in shapes.items()):
        if key not in arrays:
            raise ValueError(f"{path}: missing moment {key!r}")
        if arrays[key].shape != shape or arrays[key].dtype != np.float32:
            raise ValueError(f"{path}: moment {key!r} is {arrays[key].dtype} {arrays[key].shape}, the model needs "
                             f"float32 {shape}")
    unexpected = sorted(set(arrays) - {f"{k}.{name}" for k in ("m", "v") for name in shapes} - {"rng"})
    if unexpected:
        raise ValueError(f"{path}: unexpected tensor {unexpected[0]!r}")
    m, v = ({name: arrays[f"{k}.{name}"] for name in shapes} for k in ("m", "v"))
    return StoredState(m, v, step, tc, arrays.get("rng", np.zeros(0, np.uint8)), meta.get("framework", ""))
