"""Canonical parameters (``spec.schema``) as the ``state_dict`` of ``certify.adapters.nn_transformer.Stock``:
``nn.MultiheadAttention`` packs W_q, W_k, W_v as rows of one (3D, D) ``in_proj_weight``; ``nn.Linear`` stores
(out, in), the transpose of the canonical (in, out)."""

from __future__ import annotations

import numpy as np

from spec.config import Config

# canonical sublayer norm -> the stock layer's attribute
ENCODER_NORMS = {"self_attn_norm": "norm1", "ffn_norm": "norm2"}
DECODER_NORMS = {"self_attn_norm": "norm1", "cross_attn_norm": "norm2", "ffn_norm": "norm3"}


def _attention(p: dict[str, np.ndarray], ours: str, theirs: str, D: int) -> dict[str, np.ndarray]:
    zero = np.zeros(D, np.float32)
    return {f"{theirs}.in_proj_weight": np.concatenate([p[f"{ours}.w_{x}"].reshape(D, D).T for x in "qkv"]),
            f"{theirs}.in_proj_bias": np.concatenate([p.get(f"{ours}.b_{x}", zero).reshape(D) for x in "qkv"]),
            f"{theirs}.out_proj.weight": p[f"{ours}.w_o"].reshape(D, D).T,
            f"{theirs}.out_proj.bias": p.get(f"{ours}.b_o", zero)}


def _layer(p: dict[str, np.ndarray], ours: str, theirs: str, norms: dict[str, str], D: int) -> dict[str, np.ndarray]:
    out = _attention(p, f"{ours}.self_attn", f"{theirs}.self_attn", D)
    if "cross_attn_norm" in norms:
        out |= _attention(p, f"{ours}.cross_attn", f"{theirs}.multihead_attn", D)
    for n, m in norms.items():
        out |= {f"{theirs}.{m}.weight": p[f"{ours}.{n}.scale"], f"{theirs}.{m}.bias": p[f"{ours}.{n}.bias"]}
    return out | {f"{theirs}.linear1.weight": p[f"{ours}.ffn.w_1"].T, f"{theirs}.linear1.bias": p[f"{ours}.ffn.b_1"],
                  f"{theirs}.linear2.weight": p[f"{ours}.ffn.w_2"].T, f"{theirs}.linear2.bias": p[f"{ours}.ffn.b_2"]}


def state_dict(c: Config, params: dict[str, np.ndarray], stacks: bool = True) -> dict[str, np.ndarray]:
    """Canonical ``params`` (any float dtype) -> the stock module's float32 state dict; without ``stacks`` the
    embedder's tensors alone."""
    p = {k: np.asarray(v, np.float32) for k, v in params.items()}
    D, out = c.d_model, {"embedding.weight": p["embedding"]}
    for name in ("position_embedding", "logits_bias"):
        if name in p:
            out[name] = p[name]
    if not stacks:
        return out
    if c.decoder_only:  # the decoder-only stack is an nn.TransformerEncoder named "decoder"
        for i in range(c.n_decoder_layers):
            out |= _layer(p, f"decoder.layers.{i}", f"decoder.layers.{i}", ENCODER_NORMS, D)
        final = {"decoder.final_norm": "decoder.norm"}
    else:
        for i in range(c.n_encoder_layers):
            out |= _layer(p, f"encoder.layers.{i}", f"transformer.encoder.layers.{i}", ENCODER_NORMS, D)
        for i in range(c.n_decoder_layers):
            out |= _layer(p, f"decoder.layers.{i}", f"transformer.decoder.layers.{i}", DECODER_NORMS, D)
        final = {"encoder.final_norm": "transformer.encoder.norm", "decoder.final_norm": "transformer.decoder.norm"}
    for ours, theirs in final.items():
        if c.norm_first:
            out |= {f"{theirs}.weight": p[f"{ours}.scale"], f"{theirs}.bias": p[f"{ours}.bias"]}
    return {k: np.ascontiguousarray(v) for k, v in out.items()}
