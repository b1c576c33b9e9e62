"""Canonical weights <-> Hugging Face ``MarianMTModel``: the same function, in NumPy (no framework import).

Marian is the paper's base architecture as ``transformers`` ships it: post-LN encoder and decoder layers, one
table for both embeddings and the output projection, sinusoidal positions from 0. What it adds or lays out
otherwise is a ``spec.config`` option: its activation (``"swish"`` in the published models: ``silu``), biases on
the attention projections (``attention_bias``) and on the logits (``final_logits_bias``: ``logits_bias``), its
sine-then-cosine table (``positions="sinusoidal_halves"``, computed, not stored), ``scale_embedding``, and
LayerNorm's fixed epsilon 1e-5.

- ``to_hf`` writes a canonical model: absent biases as zeros, its positional table (whatever ``positions`` says)
  as ``embed_positions.weight``, the decoder starting at BOS.
- ``from_hf`` reads a checkpoint: biases that are all zero become the option off, so a model written by
  ``to_hf`` comes back as it was. Marian starts decoding at its pad token, which the spec masks as padding: the
  converted vocabulary then has one more row, BOS, a copy of that row, whose logits bias is ``hub.NEVER``.

What Marian cannot express is refused by name (``check_expressible``): a decoder-only or pre-LN model, heads
whose widths d_k, d_v differ from d_model / n_heads, and a LayerNorm epsilon other than 1e-5.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from spec.config import Config
from spec.convert import hub
from spec.reference.layers import positional_encoding
from spec.schema import param_specs

LAYER_NORM_EPS = 1e-5   # torch.nn.LayerNorm's default, which Marian's layers keep
_KEYS = ("vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
         "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings",
         "activation_function", "scale_embedding", "pad_token_id", "eos_token_id", "decoder_start_token_id")
_TIED = ("lm_head.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")


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
        activation_function=hub.ACTIVATIONS[config.activation][0], scale_embedding=config.scale_embedding,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True, pad_token_id=config.pad_id,
        eos_token_id=config.eos_id, decoder_start_token_id=config.bos_id, forced_eos_token_id=None,
        dropout=config.dropout, attention_dropout=0.0, activation_dropout=0.0)


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
    table = p["embedding"]
    out = {"model.shared.weight": table, **{name: table for name in _TIED},
           "final_logits_bias": p.get("logits_bias", np.zeros(config.vocab_size, np.float32))[None]}
    for side in ("encoder", "decoder"):
        out[f"model.{side}.embed_positions.weight"] = _positions(config, p)
    for ours, theirs, layout, shape in _pairs(config.replace(attention_bias=True)):    # Marian's biases always
        out[theirs] = _to(layout, p[ours]) if ours in p else np.zeros(_hf_shape(layout, shape), np.float32)
    return out


def from_hf(hf: dict[str, Any], state: dict[str, np.ndarray]) -> tuple[Config, dict[str, np.ndarray]]:
    """A ``MarianMTModel`` checkpoint (its ``config.json`` dict and state dict) -> (config, canonical params), the
    config computing in float32 on float32 weights as the checkpoint does.

    Raises:
        ValueError: naming an unknown architecture, a config field the spec cannot express, a missing tensor, or
            a tensor whose shape is not the config's.
    """
    config, copies = _config(hf)
    table = hub.tensor(state, "model.shared.weight", (hf["vocab_size"], config.d_model))
    hub.tied(state, table, _TIED)
    bias = hub.tensor(state, "final_logits_bias", (1, hf["vocab_size"]))[0] if "final_logits_bias" in state \
        else None
    if copies:
        table, bias = hub.special_rows(table, bias, copies)
    config = config.replace(positions=_positions_of(state, config))
    biases = [t for _, t, layout, _ in _pairs(config.replace(attention_bias=True)) if layout == "flat"]
    attention_bias = any(np.any(state.get(t, 0)) for t in biases)
    config = config.replace(attention_bias=attention_bias, logits_bias=bias is not None and bool(np.any(bias)))
    params = {"embedding": table}
    if config.positions == "learned":
        params["position_embedding"] = hub.tensor(state, "model.encoder.embed_positions.weight",
                                                  (config.max_len, config.d_model))
    for ours, theirs, layout, shape in _pairs(config):
        params[ours] = _from(layout, hub.tensor(state, theirs, _hf_shape(layout, shape)), shape)
    if config.logits_bias:
        params["logits_bias"] = bias
    return config, {s.name: params[s.name] for s in param_specs(config)}


def load(folder: str | Path) -> tuple[Config, dict[str, np.ndarray]]:
    """``from_hf`` of the checkpoint folder ``folder`` (``spec.convert.hub.read``); raises as both do."""
    return from_hf(*hub.read(folder))


def save(folder: str | Path, config: Config, params: dict[str, np.ndarray]) -> None:
    """Write ``to_hf(config, params)`` and its config as a folder ``MarianMTModel.from_pretrained`` reads."""
    hf = {"model_type": "marian", "architectures": ["MarianMTModel"], **hf_config(config)}
    hub.write(folder, hf, to_hf(config, params))


def _config(hf: dict[str, Any]) -> tuple[Config, list[int]]:
    """The config of a Marian ``config.json``, and the rows its vocabulary needs appended (BOS: module
    docstring)."""
    hub.require(hf, "marian", _KEYS)
    problems = [f"{a}={hf[a]} != {b}={hf[b]}" for a, b in (("encoder_attention_heads", "decoder_attention_heads"),
                                                            ("encoder_ffn_dim", "decoder_ffn_dim")) if hf[a] != hf[b]]
    shared = ("share_encoder_decoder_embeddings", "tie_word_embeddings")
    problems += [f"{k}={hf[k]}: separate source and target tables" for k in shared if not hf.get(k, True)]
    if hf.get("decoder_vocab_size") not in (None, hf["vocab_size"]):
        problems.append(f"decoder_vocab_size={hf['decoder_vocab_size']} != vocab_size={hf['vocab_size']}")
    if problems:
        raise ValueError("the spec cannot express this Marian config: " + "; ".join(problems))
    V, D, H, start = hf["vocab_size"], hf["d_model"], hf["encoder_attention_heads"], hf["decoder_start_token_id"]
    copies = [start] if start in (hf["pad_token_id"], hf["eos_token_id"]) else []
    config = Config(vocab_size=V + len(copies), d_model=D, n_heads=H, d_k=D // H, d_v=D // H,
                    d_ff=hf["encoder_ffn_dim"], n_encoder_layers=hf["encoder_layers"],
                    n_decoder_layers=hf["decoder_layers"], max_len=hf["max_position_embeddings"],
                    dropout=float(hf.get("dropout", 0.1)), layer_norm_eps=LAYER_NORM_EPS, pad_id=hf["pad_token_id"],
                    bos_id=V if copies else start, eos_id=hf["eos_token_id"],
                    activation=hub.activation(hf["activation_function"]), scale_embedding=bool(hf["scale_embedding"]),
                    positions="sinusoidal_halves", dtype="float32", param_dtype="float32")
    check_expressible(config)
    return config, copies


def _positions(config: Config, p: dict[str, np.ndarray]) -> np.ndarray:
    if config.positions == "learned":
        return p["position_embedding"]
    return positional_encoding(config.max_len, config.d_model, config.positions == "sinusoidal_halves").astype(
        np.float32)


def _positions_of(state: dict[str, np.ndarray], config: Config) -> str:
    """Marian's own table when the checkpoint stores none; else the kind of the stored one (``learned`` for a
    table that is neither sinusoidal layout, which both stacks must then share)."""
    name = "model.encoder.embed_positions.weight"
    if name not in state:
        return "sinusoidal_halves"
    stored = hub.tensor(state, name, (config.max_len, config.d_model))
    hub.tied(state, stored, ("model.decoder.embed_positions.weight",))
    for kind in ("sinusoidal_halves", "sinusoidal"):
        if np.array_equal(stored, _positions(config.replace(positions=kind), {})):
            return kind
    return "learned"


def _pairs(config: Config) -> list[tuple[str, str, str, tuple[int, ...]]]:
    """(canonical name, Marian's name, layout, canonical shape) of every layer tensor; attention biases only
    with ``config.attention_bias``."""
    shapes = {s.name: s.shape for s in param_specs(config.replace(attention_bias=True))}
    pairs = []
    for side, n, attentions in (("encoder", config.n_encoder_layers, {"self_attn": "self_attn"}),
                                ("decoder", config.n_decoder_layers,
                                 {"self_attn": "self_attn", "cross_attn": "encoder_attn"})):
        for i in range(n):
            ours, theirs = f"{side}.layers.{i}", f"model.{side}.layers.{i}"
            for a, b in attentions.items():
                for x, proj in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "out_proj")):
                    pairs.append((f"{ours}.{a}.w_{x}", f"{theirs}.{b}.{proj}.weight", "out" if x == "o" else "in"))
                    if config.attention_bias:
                        pairs.append((f"{ours}.{a}.b_{x}", f"{theirs}.{b}.{proj}.bias", "flat"))
                pairs += _norm(f"{ours}.{a}_norm", f"{theirs}.{b}_layer_norm")
            pairs += [(f"{ours}.ffn.w_1", f"{theirs}.fc1.weight", "T"), (f"{ours}.ffn.b_1", f"{theirs}.fc1.bias", ""),
                      (f"{ours}.ffn.w_2", f"{theirs}.fc2.weight", "T"), (f"{ours}.ffn.b_2", f"{theirs}.fc2.bias", "")]
            pairs += _norm(f"{ours}.ffn_norm", f"{theirs}.final_layer_norm")
    return [(o, t, layout, shapes[o]) for o, t, layout in pairs]


def _norm(ours: str, theirs: str) -> list[tuple[str, str, str]]:
    return [(f"{ours}.scale", f"{theirs}.weight", ""), (f"{ours}.bias", f"{theirs}.bias", "")]


def _to(layout: str, a: np.ndarray) -> np.ndarray:
    """A canonical tensor in torch.nn.Linear's layout: "in" (D, H, K) -> (H K, D); "out" (H, C, D) -> (D, H C);
    "T" (D, F) -> (F, D); "flat" (H, K) -> (H K); "" as it is."""
    if layout == "in":
        return a.reshape(a.shape[0], -1).T
    if layout == "out":
        return a.reshape(-1, a.shape[-1]).T
    return a.T if layout == "T" else a.reshape(-1) if layout == "flat" else a


def _from(layout: str, a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``_to``'s inverse, to the canonical ``shape``."""
    if layout in ("in", "out"):
        return np.ascontiguousarray(a.T).reshape(shape)
    return np.ascontiguousarray(a.T) if layout == "T" else a.reshape(shape)


def _hf_shape(layout: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    return _to(layout, np.empty(shape, np.float32)).shape
