"""Greedy translation over the graphs ``tools.onnx_torch`` exports, in ONNX Runtime on the CPU: NumPy and ONNX
Runtime, no torch::

    from tools import onnx_translate as R
    sessions = R.sessions("out")                 # out/encoder.onnx, out/decoder.onnx
    tokens = R.greedy(sessions, src)             # (B, L) int64, step for step spec.search.greedy_search

The graphs' inputs and outputs: ``tools.onnx_torch``'s module docstring.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from spec import search, validate
from spec.config import Config
from tools.onnx_torch import DECODER, ENCODER, names

Sessions = tuple[Any, Any]  # (encoder, decoder) onnxruntime.InferenceSession


def sessions(folder: str | os.PathLike, threads: int | None = None) -> Sessions:
    """(encoder, decoder) ONNX Runtime sessions on the CPU provider over the graphs in ``folder``; ``threads``:
    intra-op threads (default: ONNX Runtime's own)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    return tuple(ort.InferenceSession(str(Path(folder) / f), options, providers=["CPUExecutionProvider"])
                 for f in (ENCODER, DECODER))


def config_of(session: Any) -> Config:
    """The config an exported graph was traced from (its ``config`` metadata)."""
    return Config.from_dict(json.loads(session.get_modelmeta().custom_metadata_map["config"]))


def start(sessions: Sessions, src: np.ndarray) -> dict[str, np.ndarray]:
    """The decoder's inputs but ``tokens`` for src (B, S) int64: the encoder's outputs, an empty cache (t = 0)."""
    c = config_of(sessions[0])
    out = dict(zip(names(c)["encoder_out"], sessions[0].run(None, {"src": src.astype(np.int64)}), strict=True))
    feeds = {k: v for k, v in out.items() if k != "memory"}
    feeds["key_mask"] = np.zeros((len(src), 0), bool)
    for i in range(c.n_decoder_layers):
        feeds[f"self_k.{i}"] = np.zeros((len(src), c.n_heads, 0, c.d_k), np.float32)
        feeds[f"self_v.{i}"] = np.zeros((len(src), c.n_heads, 0, c.d_v), np.float32)
    return feeds


def step(decoder: Any, tokens: np.ndarray, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, dict]:
    """tokens (B, n) int64 at the cache's length -> (logits (B, n, V) float32, the next step's feeds)."""
    c = config_of(decoder)
    out = dict(zip(names(c)["decoder_out"], decoder.run(None, {**feeds, "tokens": tokens.astype(np.int64)}),
                   strict=True))
    return out["logits"], {**feeds, **{k.removeprefix("next_"): v for k, v in out.items() if k.startswith("next_")}}


def greedy(sessions: Sessions, src: Any, max_new_tokens: int | None = None) -> np.ndarray:
    """Greedy decoding over the exported graphs, step for step ``spec.search.greedy_search``: src (B, S) int ->
    tokens (B, L) int64, EOS included, right-padded with ``pad_id``; max_new_tokens as ``spec.api.greedy_search``.

    Raises:
        ValueError: from ``spec.validate.check_source`` and ``generation_limits``, before any graph runs.
    """
    c = config_of(sessions[0])
    src = validate.host_ids("src", src)
    validate.check_source(src, c)
    limits = validate.generation_limits(src, c, max_new_tokens)
    B, n = len(src), int(limits.max())
    feeds, out = start(sessions, src), np.full((B, n), c.pad_id, np.int64)
    done, tokens = np.zeros(B, bool), np.full(B, c.bos_id, np.int64)
    for t in range(n):
        logits, feeds = step(sessions[1], tokens[:, None], feeds)
        tokens = np.where(done, c.pad_id, np.argmax(search.forbid_special(logits[:, 0], c), axis=-1))
        out[:, t] = tokens
        done |= (tokens == c.eos_id) | (t + 1 >= limits)
        if done.all():
            return out[:, :t + 1]
    return out
