"""Canonical weights <-> Hugging Face ``GPT2LMHeadModel``: the same function, in NumPy (no framework import).

GPT-2 is the decoder-only model of ``spec.config`` with these options: pre-LN with a final LayerNorm
(``norm_first``), ``activation="gelu_tanh"`` (its ``"gelu_new"``), biases on the attention projections, learned
positions, the embedding not scaled by sqrt(d_model), LayerNorm epsilon 1e-5. Its projections are ``Conv1D``s,
whose weights are laid out (in, out); the queries, keys and values are one (D, 3D) product ``c_attn``.

GPT-2 has one special token, ``<|endoftext|>``, both BOS and EOS, and no padding token; the spec's three ids
differ. ``from_hf`` therefore appends rows to the vocabulary: PAD (zeros) when the checkpoint names no pad token,
and BOS (a copy of the checkpoint's BOS row) when BOS is EOS, each with the logits bias ``hub.NEVER``, so that no
probability goes to them. Ids below the checkpoint's vocabulary size mean what they mean there.

What GPT-2 cannot express is refused by name (``check_expressible``): an encoder-decoder or post-LN model, heads
whose widths differ from d_model / n_heads, a scaled embedding, and a logits bias.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from spec.config import Config
from spec.convert import hub
from spec.reference.layers import positional_encoding
from spec.schema import param_specs

_KEYS = ("vocab_size", "n_embd", "n_head", "n_layer", "n_positions", "activation_function", "layer_norm_epsilon",
         "bos_token_id", "eos_token_id")


def check_expressible(config: Config) -> None:
    """Raise ``ValueError`` naming the config field GPT-2 cannot express (module docstring)."""
    problems = []
    if not config.decoder_only:
        problems.append(f"n_encoder_layers={config.n_encoder_layers}: GPT-2 is decoder-only")
    if not config.norm_first:
        problems.append("norm_first=False: GPT-2's layers are pre-LN")
    if not config.d_k == config.d_v == config.d_model // config.n_heads or config.d_model % config.n_heads:
        problems.append(f"d_k={config.d_k}, d_v={config.d_v}: GPT-2's heads are d_model / n_heads = "
                        f"{config.d_model / config.n_heads:g} wide")
    if config.scale_embedding:
        problems.append("scale_embedding=True: GPT-2 adds its embedding unscaled, and its table is the output's")
    if config.logits_bias:
        problems.append("logits_bias=True: GPT-2's output projection has no bias")
    if problems:
        raise ValueError("GPT2LMHeadModel cannot express this config: " + "; ".join(problems))


def hf_config(config: Config) -> dict[str, Any]:
    """The ``transformers.GPT2Config`` keyword arguments of ``config``."""
    check_expressible(config)
    return dict(vocab_size=config.vocab_size, n_embd=config.d_model, n_head=config.n_heads,
                n_layer=config.n_decoder_layers, n_positions=config.max_len, n_inner=config.d_ff,
                activation_function=hub.ACTIVATIONS[config.activation][0], layer_norm_epsilon=config.layer_norm_eps,
                bos_token_id=config.bos_id, eos_token_id=config.eos_id, pad_token_id=config.pad_id,
                resid_pdrop=config.dropout, embd_pdrop=config.dropout, attn_pdrop=0.0, tie_word_embeddings=True)


def to_hf(config: Config, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Canonical ``params`` -> a ``GPT2LMHeadModel`` state dict of float32 NumPy arrays; a sinusoidal table is
    written as the learned one it equals.

    Raises:
        ValueError: from ``check_expressible``, or a parameter missing from ``params``.
    """
    check_expressible(config)
    missing = [s.name for s in param_specs(config) if s.name not in params]
    if missing:
        raise ValueError(f"params lack {missing[0]!r} (and {len(missing) - 1} more)")
    p = {k: np.asarray(v, np.float32) for k, v in params.items()}
    positions = p["position_embedding"] if config.positions == "learned" else positional_encoding(
        config.max_len, config.d_model, config.positions == "sinusoidal_halves").astype(np.float32)
    out = {"transformer.wte.weight": p["embedding"], "lm_head.weight": p["embedding"],
           "transformer.wpe.weight": positions}
    zero = np.zeros(config.d_model, np.float32)                 # the biases of a model without attention_bias
    for i in range(config.n_decoder_layers):
        ours, theirs = f"decoder.layers.{i}", f"transformer.h.{i}"
        bias = {b: p.get(f"{ours}.self_attn.{b}", zero).reshape(-1) for b in ("b_q", "b_k", "b_v", "b_o")}
        out[f"{theirs}.attn.c_attn.weight"] = np.concatenate(
            [p[f"{ours}.self_attn.w_{x}"].reshape(config.d_model, -1) for x in "qkv"], axis=1)       # (D, 3 D)
        out[f"{theirs}.attn.c_attn.bias"] = np.concatenate([bias["b_q"], bias["b_k"], bias["b_v"]])
        out[f"{theirs}.attn.c_proj.weight"] = p[f"{ours}.self_attn.w_o"].reshape(-1, config.d_model)  # (H C, D)
        out[f"{theirs}.attn.c_proj.bias"] = bias["b_o"]
        for ffn, fc in (("1", "c_fc"), ("2", "c_proj")):
            out[f"{theirs}.mlp.{fc}.weight"], out[f"{theirs}.mlp.{fc}.bias"] = p[f"{ours}.ffn.w_{ffn}"], \
                p[f"{ours}.ffn.b_{ffn}"]
        out |= _norms(p, ours, theirs)
    return out | _norm(p, "decoder.final_norm", "transformer.ln_f")


def from_hf(hf: dict[str, Any], state: dict[str, np.ndarray]) -> tuple[Config, dict[str, np.ndarray]]:
    """A ``GPT2LMHeadModel`` checkpoint (its ``config.json`` dict and state dict) -> (config, canonical params),
    computing in float32 on float32 weights as the checkpoint does; rows appended as the module docstring says.

    Raises:
        ValueError: naming an unknown architecture, a config field the spec cannot express, a missing tensor, or
            a tensor whose shape is not the config's.
    """
    config, copies = _config(hf)
    V, D = hf["vocab_size"], config.d_model
    table = hub.tensor(state, "transformer.wte.weight", (V, D))
    hub.tied(state, table, ("lm_head.weight",))
    bias = None
    if copies:
        table, bias = hub.special_rows(table, None, copies)
    params = {"embedding": table, "logits_bias": bias,
              "position_embedding": hub.tensor(state, "transformer.wpe.weight", (config.max_len, D))}
    for i in range(config.n_decoder_layers):
        ours, theirs = f"decoder.layers.{i}", f"transformer.h.{i}"
        qkv = hub.tensor(state, f"{theirs}.attn.c_attn.weight", (D, 3 * D))
        qkv_bias = hub.tensor(state, f"{theirs}.attn.c_attn.bias", (3 * D,))
        for j, x in enumerate("qkv"):
            params[f"{ours}.self_attn.w_{x}"] = np.ascontiguousarray(qkv[:, j * D:(j + 1) * D]).reshape(
                D, config.n_heads, config.d_k)
            params[f"{ours}.self_attn.b_{x}"] = qkv_bias[j * D:(j + 1) * D].reshape(config.n_heads, config.d_k)
        params[f"{ours}.self_attn.w_o"] = hub.tensor(state, f"{theirs}.attn.c_proj.weight", (D, D)).reshape(
            config.n_heads, config.d_v, D)
        params[f"{ours}.self_attn.b_o"] = hub.tensor(state, f"{theirs}.attn.c_proj.bias", (D,))
        for ffn, fc, shape in (("1", "c_fc", (D, config.d_ff)), ("2", "c_proj", (config.d_ff, D))):
            params[f"{ours}.ffn.w_{ffn}"] = hub.tensor(state, f"{theirs}.mlp.{fc}.weight", shape)
            params[f"{ours}.ffn.b_{ffn}"] = hub.tensor(state, f"{theirs}.mlp.{fc}.bias", shape[-1:])
        params |= {k: hub.tensor(state, v, (D,)) for v, k in _norms({}, ours, theirs, names=True).items()}
    params |= {k: hub.tensor(state, v, (D,)) for v, k in _norm({}, "decoder.final_norm", "transformer.ln_f",
                                                                names=True).items()}
    return config, {s.name: params[s.name] for s in param_specs(config)}


def load(folder: str | Path) -> tuple[Config, dict[str, np.ndarray]]:
    """``from_hf`` of the checkpoint folder ``folder`` (``spec.convert.hub.read``); raises as both do."""
    return from_hf(*hub.read(folder))


def save(folder: str | Path, config: Config, params: dict[str, np.ndarray]) -> None:
    """Write ``to_hf(config, params)`` and its config as a folder ``GPT2LMHeadModel.from_pretrained`` reads."""
    hf = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], **hf_config(config)}
    hub.write(folder, hf, to_hf(config, params))


def _config(hf: dict[str, Any]) -> tuple[Config, list[int]]:
    """The config of a GPT-2 ``config.json``, and the rows its vocabulary needs appended (module docstring)."""
    hub.require(hf, "gpt2", _KEYS)
    plain = (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False), ("add_cross_attention", False))
    problems = [f"{k}={hf[k]}" for k, paper in plain if hf.get(k, paper) != paper]
    if problems:
        raise ValueError("the spec cannot express this GPT-2 config: " + "; ".join(problems))
    V, D, H = hf["vocab_size"], hf["n_embd"], hf["n_head"]
    bos, eos, pad = hf["bos_token_id"], hf["eos_token_id"], hf.get("pad_token_id")
    copies = ([] if pad is not None else [-1]) + ([bos] if bos == eos else [])
    config = Config(vocab_size=V + len(copies), d_model=D, n_heads=H, d_k=D // H, d_v=D // H,
                    d_ff=hf.get("n_inner") or 4 * D, n_encoder_layers=0, n_decoder_layers=hf["n_layer"],
                    max_len=hf["n_positions"], dropout=float(hf.get("resid_pdrop", 0.1)),
                    layer_norm_eps=float(hf["layer_norm_epsilon"]), pad_id=V if pad is None else pad,
                    bos_id=V + len(copies) - 1 if bos == eos else bos, eos_id=eos, norm_first=True,
                    activation=hub.activation(hf["activation_function"]), attention_bias=True,
                    logits_bias=bool(copies), positions="learned", scale_embedding=False, dtype="float32",
                    param_dtype="float32")
    return config, copies


def _norms(p: dict[str, np.ndarray], ours: str, theirs: str, names: bool = False) -> dict[str, Any]:
    return _norm(p, f"{ours}.self_attn_norm", f"{theirs}.ln_1", names) | _norm(p, f"{ours}.ffn_norm",
                                                                                 f"{theirs}.ln_2", names)


def _norm(p: dict[str, np.ndarray], ours: str, theirs: str, names: bool = False) -> dict[str, Any]:
    """GPT-2's tensors of one LayerNorm: ``{their name: our tensor}``, or with ``names`` ``{their name: ours}``."""
    pairs = {f"{theirs}.weight": f"{ours}.scale", f"{theirs}.bias": f"{ours}.bias"}
    return pairs if names else {t: p[o] for t, o in pairs.items()}
