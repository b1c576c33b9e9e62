"""Canonical parameter names, shapes and dtypes (paper section 3).

One matrix ``embedding`` (V, D) serves the source embedding, the target
embedding and, transposed, the output projection (section 3.4). Attention
projections carry no bias, as in the paper's equations (section 3.2.2):
``W_q, W_k`` are (D, H, K), ``W_v`` is (D, H, C) and ``W_o`` is (H, C, D), so
a head's slice ``W_q[:, h, :]`` is the paper's ``W_i^Q`` (d_model x d_k).
The position-wise FFN has ``w_1`` (D, F), ``b_1`` (F), ``w_2`` (F, D), ``b_2`` (D)
(equation 2). Every LayerNorm has ``scale`` and ``bias`` (D).

Options of ``spec.config.Config`` add parameters: ``attention_bias`` the projections' biases ``b_q``, ``b_k``
(H, K), ``b_v`` (H, C) and ``b_o`` (D), each after its weight; ``positions="learned"`` the table
``position_embedding`` (max_len, D) and ``logits_bias`` the bias ``logits_bias`` (V), in that order after
``embedding``: the parameters of the embedder, first.
"""

from __future__ import annotations

import dataclasses

from spec.config import Config


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str  # "embedding" | "linear" | "bias" | "norm_scale" | "norm_bias"
    fan_in: int = 0   # for Glorot initialisation of "linear"
    fan_out: int = 0


def _attention(prefix: str, c: Config) -> list[ParamSpec]:
    D, H, K, C = c.d_model, c.n_heads, c.d_k, c.d_v
    dt = c.param_dtype
    specs = []
    for name, shape, bias, fans in (("q", (D, H, K), (H, K), (D, H * K)), ("k", (D, H, K), (H, K), (D, H * K)),
                                    ("v", (D, H, C), (H, C), (D, H * C)), ("o", (H, C, D), (D,), (H * C, D))):
        specs.append(ParamSpec(f"{prefix}.w_{name}", shape, dt, "linear", *fans))
        if c.attention_bias:
            specs.append(ParamSpec(f"{prefix}.b_{name}", bias, dt, "bias"))
    return specs


def _norm(prefix: str, c: Config) -> list[ParamSpec]:
    return [ParamSpec(f"{prefix}.scale", (c.d_model,), c.param_dtype, "norm_scale"),
            ParamSpec(f"{prefix}.bias", (c.d_model,), c.param_dtype, "norm_bias")]


def _ffn(prefix: str, c: Config) -> list[ParamSpec]:
    D, F, dt = c.d_model, c.d_ff, c.param_dtype
    return [
        ParamSpec(f"{prefix}.w_1", (D, F), dt, "linear", D, F),
        ParamSpec(f"{prefix}.b_1", (F,), dt, "bias"),
        ParamSpec(f"{prefix}.w_2", (F, D), dt, "linear", F, D),
        ParamSpec(f"{prefix}.b_2", (D,), dt, "bias"),
    ]


def param_specs(c: Config) -> list[ParamSpec]:
    """Every parameter of the model for config ``c``, in canonical order. A decoder-only model (``c.decoder_only``)
    has no encoder and no cross-attention: the embedding, the decoder's self-attention and FFN sublayers with their
    norms, and (pre-LN) ``decoder.final_norm``."""
    specs = [ParamSpec("embedding", (c.vocab_size, c.d_model), c.param_dtype, "embedding")]
    if c.positions == "learned":
        specs.append(ParamSpec("position_embedding", (c.max_len, c.d_model), c.param_dtype, "embedding"))
    if c.logits_bias:
        specs.append(ParamSpec("logits_bias", (c.vocab_size,), c.param_dtype, "bias"))
    for i in range(c.n_encoder_layers):
        p = f"encoder.layers.{i}"
        specs += _attention(f"{p}.self_attn", c) + _norm(f"{p}.self_attn_norm", c)
        specs += _ffn(f"{p}.ffn", c) + _norm(f"{p}.ffn_norm", c)
    if c.norm_first and not c.decoder_only:
        specs += _norm("encoder.final_norm", c)
    for i in range(c.n_decoder_layers):
        p = f"decoder.layers.{i}"
        specs += _attention(f"{p}.self_attn", c) + _norm(f"{p}.self_attn_norm", c)
        if not c.decoder_only:
            specs += _attention(f"{p}.cross_attn", c) + _norm(f"{p}.cross_attn_norm", c)
        specs += _ffn(f"{p}.ffn", c) + _norm(f"{p}.ffn_norm", c)
    if c.norm_first:
        specs += _norm("decoder.final_norm", c)
    return specs


def param_count(c: Config) -> int:
    """Number of scalar parameters; the shared embedding is counted once.

    For the ``base`` preset this is 63,045,632 (18,944,000 of them the
    37000 x 512 shared embedding). The paper's Table 3 gives "65M" for base;
    the paper does not itemise it, and the difference is within what a
    different vocabulary or untied output layer would give.
    """
    total = 0
    for s in param_specs(c):
        n = 1
        for d in s.shape:
            n *= d
        total += n
    return total
