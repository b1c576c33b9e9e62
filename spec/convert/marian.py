"""Canonical weights -> Hugging Face ``MarianMTModel``: the same function, in NumPy (no framework import).

Marian is the paper's base architecture as ``transformers`` ships it: post-LN encoder and decoder layers, the
embedding tied to the output projection and scaled by sqrt(d_model), sinusoidal positions from 0. It differs in
what it adds, and a canonical model fills those parts so that Marian computes the spec's function:

- biases on the attention projections and on the logits (``final_logits_bias``): zeros;
- its positional table, a weight of the state dict (sin half then cos half): the paper's interleaved table
  (``spec.reference.layers.positional_encoding``) in its place;
- ``activation_function="relu"`` (Marian's default is SiLU), ``scale_embedding=True``, and the decoder starting
  from the spec's BOS id.

What Marian cannot express is refused by name (``check_expressible``): a decoder-only or pre-LN model, heads
whose widths d_k, d_v differ from d_model / n_heads, and a LayerNorm epsilon other than its fixed 1e-5.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from spec.config import Config
from spec.reference.layers import positional_encoding
from spec.schema import param_specs

LAYER_NORM_EPS = 1e-5   # torch.nn.LayerNorm's default, which Marian's layers keep


def check_expressible(config: Config) -> None:
    """Raise ``ValueError`` naming the config field Marian cannot express (module docstring)."""
    problems = []
    if config.decoder_only:
        problems.append("n_encoder_layers=0 (decoder-only): Marian is an encoder-decoder")
    if config.norm_first:
        problems.append("norm_first=True: Marian's layers are post-LN")
    if not config.d_k == config.d_v == config.d_model // config.n_heads or config.d_model % config.n_heads:
        problems.append(f"d_k={config.d_k}, d_v={config.d_v}: Marian's heads are d_model / n_heads = "
                        f"{config.d_model / config.n_heads:g} wide")
    if config.layer_norm_eps != LAYER_NORM_EPS:
        problems.append(f"layer_norm_eps={config.layer_norm_eps}: Marian's LayerNorm epsilon is {LAYER_NORM_EPS}")
    if problems:
        raise ValueError("MarianMTModel cannot express this config: " + "; ".join(problems))


def hf_config(config: Config) -> dict[str, Any]:
    """The ``transformers.MarianConfig`` keyword arguments of ``config``."""
    check_expressible(config)
    return dict(
        vocab_size=config.vocab_size, decoder_vocab_size=config.vocab_size, d_model=config.d_model,
        encoder_layers=config.n_encoder_layers, decoder_layers=config.n_decoder_layers,
        encoder_attention_heads=config.n_heads, decoder_attention_heads=config.n_heads,
        encoder_ffn_dim=config.d_ff, decoder_ffn_dim=config.d_ff, max_position_embeddings=config.max_len,
        activation_function="relu", scale_embedding=True, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, pad_token_id=config.pad_id, eos_token_id=config.eos_id,
        decoder_start_token_id=config.bos_id, forced_eos_token_id=None, dropout=config.dropout,
        attention_dropout=0.0, activation_dropout=0.0)


def to_hf(config: Config, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Canonical ``params`` (``spec.schema`` names) -> a ``MarianMTModel`` state dict of float32 NumPy arrays.

    Raises:
        ValueError: from ``check_expressible``, or a parameter missing from ``params``.
    """
    check_expressible(config)
    missing = [s.name for s in param_specs(config) if s.name not in params]
    if missing:
        raise ValueError(f"params lack {missing[0]!r} (and {len(missing) - 1} more)")
    p = {k: np.asarray(v, np.float32) for k, v in params.items()}
    table, pe = p["embedding"], positional_encoding(config.max_len, config.d_model).astype(np.float32)
    out = {"model.shared.weight": table, "lm_head.weight": table,
           "final_logits_bias": np.zeros((1, config.vocab_size), np.float32)}
    for side in ("encoder", "decoder"):
        out[f"model.{side}.embed_tokens.weight"] = table
        out[f"model.{side}.embed_positions.weight"] = pe
    for i in range(config.n_encoder_layers):
        out |= _layer(p, f"encoder.layers.{i}", {"self_attn": "self_attn"})
    for i in range(config.n_decoder_layers):
        out |= _layer(p, f"decoder.layers.{i}", {"self_attn": "self_attn", "cross_attn": "encoder_attn"})
    return out


def _layer(p: dict[str, np.ndarray], prefix: str, attentions: dict[str, str]) -> dict[str, np.ndarray]:
    """One layer's Marian tensors: its attentions (canonical name -> Marian's), the FFN and the three norms."""
    hf, out = f"model.{prefix}", {}
    for ours, theirs in attentions.items():
        for w, proj in (("w_q", "q_proj"), ("w_k", "k_proj"), ("w_v", "v_proj")):
            weight = p[f"{prefix}.{ours}.{w}"]                                   # (D, H, K)
            out[f"{hf}.{theirs}.{proj}.weight"] = weight.reshape(weight.shape[0], -1).T   # (H K, D)
            out[f"{hf}.{theirs}.{proj}.bias"] = np.zeros(weight.shape[1] * weight.shape[2], np.float32)
        w_o = p[f"{prefix}.{ours}.w_o"]                                          # (H, C, D)
        out[f"{hf}.{theirs}.out_proj.weight"] = w_o.reshape(-1, w_o.shape[-1]).T       # (D, H C)
        out[f"{hf}.{theirs}.out_proj.bias"] = np.zeros(w_o.shape[-1], np.float32)
        out |= _norm(p, f"{prefix}.{ours}_norm", f"{hf}.{theirs}_layer_norm")
    out[f"{hf}.fc1.weight"], out[f"{hf}.fc1.bias"] = p[f"{prefix}.ffn.w_1"].T, p[f"{prefix}.ffn.b_1"]
    out[f"{hf}.fc2.weight"], out[f"{hf}.fc2.bias"] = p[f"{prefix}.ffn.w_2"].T, p[f"{prefix}.ffn.b_2"]
    return out | _norm(p, f"{prefix}.ffn_norm", f"{hf}.final_layer_norm")


def _norm(p: dict[str, np.ndarray], ours: str, theirs: str) -> dict[str, np.ndarray]:
    return {f"{theirs}.weight": p[f"{ours}.scale"], f"{theirs}.bias": p[f"{ours}.bias"]}
