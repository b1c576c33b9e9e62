"""NumPy reference of the Transformer (Vaswani et al., 2017), exact or contract-faithful.

``Numerics("exact")`` computes in float64 and never rounds; ``Numerics("bfloat16")`` and ``Numerics("float32")``
round exactly where ``spec.numerics`` says. Arrays are float64 throughout (holding values representable in the
dtype they were last rounded to). The package has the files and classes of the impls' skeleton
(``numerics``, ``layers``, ``stacks``, ``model``); this module adds the functional entry points the spec's tools use, in
the layouts of ``spec.shapes`` (keys and values (B, S, H, K), masks (B|1, 1, 1|T, S)).
"""

from __future__ import annotations

import numpy as np

from spec.config import Config
from spec.numerics import Numerics
from spec.reference import layers, stacks
from spec.reference.layers import Params, positional_encoding
from spec.reference.lm import LanguageModel
from spec.reference.model import Transformer
from spec.reference.numerics import round_to
from spec.reference.stacks import KVCache, causal_mask, key_padding_mask

__all__ = [
    "KVCache", "LanguageModel", "Params", "Transformer", "as_float64", "causal_mask",
    "forward", "key_padding_mask", "layer_norm", "positional_encoding", "run_layer", "scaled_dot_product_attention",
]


def as_float64(params: dict[str, np.ndarray], c: Config) -> Params:
    """Canonical parameters as they enter the computation: cast from ``c.param_dtype`` to ``c.dtype``
    (``spec.numerics`` rule 0), held as exact float64 copies.

    Exact mode computes with these too: the model a mixed-precision config describes is the one whose
    parameters are the cast values.
    """
    return {k: round_to(v, c.dtype) for k, v in params.items()}


def scaled_dot_product_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray,
                                 nx: Numerics) -> np.ndarray:
    """Equation (1): q (B, T, H, K), k (B, S, H, K), v (B, S, H, C), mask (B|1, 1, 1|T, S) -> (B, T, H, C)."""
    return layers.scaled_dot_product_attention(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), mask[:, 0], nx)


def layer_norm(params: Params, prefix: str, x: np.ndarray, eps: float, nx: Numerics) -> np.ndarray:
    """The LayerNorm of the parameters under ``prefix``: ``LayerNorm(...).forward(x)``."""
    return layers.LayerNorm(params, prefix, eps, nx).forward(x)


def forward(params: Params, src: np.ndarray, tgt_in: np.ndarray, c: Config, nx: Numerics) -> np.ndarray:
    """Teacher-forced forward: src (B, S), tgt_in (B, T) -> logits (B, T, V); records into ``spec.recording``.

    Raises:
        ValueError: from ``spec.validate.check_forward``.
    """
    return Transformer(params, c, nx).forward(src, tgt_in)


def run_layer(layer: str, params: Params, prefix: str, inputs: dict[str, np.ndarray], c: Config,
              nx: Numerics) -> dict[str, np.ndarray]:
    """One layer of ``spec.shapes.LAYERS`` alone, with the parameters under ``prefix``.

    ``add_norm`` is the paper's post-LN ``LayerNorm(x + y)`` with the norm ``prefix``;
    ``positional_encoding`` returns the fp32 table for ``c.max_len``.
    """
    i = inputs
    if layer == "positional_encoding":
        return {"pe": nx.acc(layers.positional_encoding(c.max_len, c.d_model, c.positions == "sinusoidal_halves"))}
    if layer == "embedding":
        return {"x": layers.Embedder(params, c, nx).encode(i["ids"])}
    if layer == "scaled_dot_product_attention":
        return {"out": scaled_dot_product_attention(i["q"], i["k"], i["v"], i["mask"], nx)}
    if layer == "multi_head_attention":
        attn = layers.MultiHeadAttention(params, prefix, nx)
        return {"out": attn.forward(i["x_q"], attn.project_kv(i["x_kv"]), i["mask"][:, 0])}
    if layer == "add_norm":
        return {"out": layer_norm(params, prefix, nx.act(i["x"] + i["y"]), c.layer_norm_eps, nx)}
    if layer == "feed_forward":
        return {"out": layers.FeedForward(params, prefix, c.activation, nx).forward(i["x"])}
    if layer == "encoder_layer":
        return {"out": stacks.EncoderLayer(params, prefix, c, nx).forward(i["x"], i["mask"][:, 0])}
    if layer == "decoder_layer":
        dec = stacks.DecoderLayer(params, prefix, c, nx)
        (B, T), H = i["y"].shape[:2], c.n_heads
        self_kv = (np.zeros((B, H, T, c.d_k)), np.zeros((B, H, T, c.d_v)))
        out, _ = dec.forward(i["y"], self_kv, i["self_mask"][:, 0], dec.cross_attn.project_kv(i["memory"]),
                             i["memory_mask"][:, 0], 0)
        return {"out": out}
    if layer == "output_projection":
        return {"logits": layers.Embedder(params, c, nx).decode(i["h"])}
    raise ValueError(f"unknown layer {layer!r}")

