"""What the converters share: a checkpoint folder as the Hugging Face hub stores one, the activation names of
``transformers``, and the special-token rows a converted vocabulary may need.

A folder holds ``config.json`` and ``model.safetensors`` (or the shards that ``model.safetensors.index.json``
lists). Checkpoints stored only as ``pytorch_model.bin`` (a pickle) need torch to read and are refused by name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import safetensors.numpy

CONFIG, WEIGHTS, INDEX = "config.json", "model.safetensors", "model.safetensors.index.json"
# transformers' ``activation_function`` names of spec.config.ACTIVATIONS, the first one written by ``to_hf``
ACTIVATIONS = {"relu": ("relu",), "gelu": ("gelu",), "gelu_tanh": ("gelu_new", "gelu_pytorch_tanh"),
               "silu": ("swish", "silu")}
# The logits bias of a row added for a special token: exp(-1e4 - max) is 0 in fp32, so the row takes no probability
# and a converted model's log-softmax is the checkpoint's; finite, so no inf - inf arises anywhere.
NEVER = -1.0e4


def read(folder: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The ``config.json`` dict and every tensor of the checkpoint in ``folder`` (float32 arrays as stored).

    Raises:
        ValueError: naming the missing file, a config that is not JSON, or a weights file that is not a whole
            safetensors file (a truncated download).
    """
    folder = Path(folder)
    if not (folder / CONFIG).is_file():
        raise ValueError(f"{folder / CONFIG}: no such file (a checkpoint folder holds {CONFIG} and {WEIGHTS})")
    try:
        hf = json.loads((folder / CONFIG).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{folder / CONFIG}: not JSON ({e})") from None
    if (folder / INDEX).is_file():
        files = sorted(set(json.loads((folder / INDEX).read_text())["weight_map"].values()))
    elif (folder / WEIGHTS).is_file():
        files = [WEIGHTS]
    else:
        bin_only = " (only pytorch_model.bin, a pickle: load it with torch and save it as safetensors)" \
            if (folder / "pytorch_model.bin").is_file() else ""
        raise ValueError(f"{folder / WEIGHTS}: no such file{bin_only}")
    state = {}
    for name in files:
        try:
            state |= safetensors.numpy.load_file(str(folder / name))
        except (safetensors.SafetensorError, OSError, ValueError) as e:
            raise ValueError(f"{folder / name}: not a whole safetensors file ({e})") from None
    return hf, state


def write(folder: str | Path, hf: dict[str, Any], state: dict[str, np.ndarray]) -> None:
    """Write ``hf`` as ``config.json`` and ``state`` as ``model.safetensors`` (float32, contiguous), as
    ``save_pretrained`` lays a folder out; ``from_pretrained`` reads it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG).write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    arrays = {k: np.ascontiguousarray(v, np.float32) for k, v in state.items()}
    safetensors.numpy.save_file(arrays, str(folder / WEIGHTS), metadata={"format": "pt"})


def require(hf: dict[str, Any], model_type: str, keys: tuple[str, ...]) -> None:
    """Raise ``ValueError`` unless ``hf`` is a config of ``model_type`` holding every key of ``keys``."""
    if hf.get("model_type") != model_type:
        raise ValueError(f"unknown architecture: model_type={hf.get('model_type')!r}, architectures="
                         f"{hf.get('architectures')!r}; this converter reads model_type={model_type!r}")
    missing = [k for k in keys if k not in hf]
    if missing:
        raise ValueError(f"config.json lacks {missing}")


def activation(name: str) -> str:
    """``spec.config.ACTIVATIONS``' name of transformers' ``activation_function`` ``name``.

    Raises:
        ValueError: naming an activation the spec does not have.
    """
    for ours, theirs in ACTIVATIONS.items():
        if name in theirs:
            return ours
    raise ValueError(f"activation_function={name!r}: the spec has {sorted(sum(ACTIVATIONS.values(), ()))}")


def tensor(state: dict[str, np.ndarray], name: str, shape: tuple[int, ...]) -> np.ndarray:
    """``state[name]`` as float32, checked against ``shape``.

    Raises:
        ValueError: naming a tensor that is missing or whose shape is not the config's (a mismatched config).
    """
    if name not in state:
        raise ValueError(f"the checkpoint lacks {name!r}")
    a = np.asarray(state[name], np.float32)
    if a.shape != tuple(shape):
        raise ValueError(f"{name}: shape {a.shape}, but config.json gives {tuple(shape)}")
    return a


def tied(state: dict[str, np.ndarray], table: np.ndarray, names: tuple[str, ...]) -> None:
    """Raise ``ValueError`` if a tensor of ``names`` that the checkpoint holds differs from the shared ``table``."""
    for name in names:
        if name in state and not np.array_equal(np.asarray(state[name], np.float32), table):
            raise ValueError(f"{name} differs from the shared embedding: an untied table the spec cannot express")


def special_rows(table: np.ndarray, bias: np.ndarray | None, copies: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The table (V, D) with a row appended per id of ``copies`` (a copy of that row; -1: zeros) and the logits
    bias (V + n) whose appended entries are ``NEVER``."""
    rows = [table[i] if i >= 0 else np.zeros(table.shape[1], np.float32) for i in copies]
    bias = np.zeros(table.shape[0], np.float32) if bias is None else bias
    return (np.concatenate([table, np.asarray(rows, np.float32).reshape(-1, table.shape[1])]),
            np.concatenate([bias, np.full(len(copies), NEVER, np.float32)]))

