"""The Transformer's layers (Vaswani et al., 2017, section 3) in NumPy, exact or contract-faithful.

Shape letters of ``spec.config``. Each layer holds float64 views of its canonical parameters (``as_float64``)
and the ``Numerics`` that says where it rounds (``spec.reference.numerics``). Queries are laid out (B, L, H, K);
keys and values heads-major (B, H, L, K), the KV cache's layout (``spec.api``). Dropout (``dropout``) only where
a forward is given an ``rng``: evaluation otherwise. The mutation test (``conformance.mutants``) replaces these
functions and methods one at a time, so every call goes through the module or the class.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from spec.config import Config
from spec.numerics import MASKED_SCORE, Numerics
from spec.recording import record, scoped
from spec.reference.numerics import linear, logits, matmul_f32

Params = dict[str, np.ndarray]
# Dropout's source of masks: None (evaluation), a NumPy generator (draws), or {scoped "<site>.keep": mask} (replays
# the masks another forward recorded).
Rng = np.random.Generator | Mapping[str, np.ndarray] | None


def dropout(x: np.ndarray, site: str, rate: float, rng: Rng, nx: Numerics) -> np.ndarray:
    """Inverted dropout at a dropout site (section 5.4, ``spec.shapes.dropout_sites``): x (B, L, D) -> (B, L, D),
    each element kept with probability 1 - rate and divided by 1 - rate in fp32 (the divisor rounded to fp32), the
    quotient rounded once to the activation dtype; the identity without ``rng`` or at rate 0. Records the result as
    ``site`` and, with dropout, the keep mask as ``<site>.keep``."""
    if rng is None or rate == 0.0:
        return record(site, x)
    keep = np.asarray(rng[scoped(f"{site}.keep")] if isinstance(rng, Mapping) else rng.random(x.shape) >= rate, bool)
    record(f"{site}.keep", keep)
    return record(site, np.where(keep, nx.act(nx.acc(x) / nx.acc(1.0 - rate)), 0.0))


def positional_encoding(length: int, d_model: int, halves: bool = False) -> np.ndarray:
    """Sinusoidal table (length, D), float64 (section 3.5), interleaved.

    ``PE[pos, 2i] = sin(pos / 10000^(2i/D))``, ``PE[pos, 2i+1] = cos(...)``, positions from 0. With ``halves``
    (``config.positions="sinusoidal_halves"``) the same D/2 sines fill the first half and the cosines the second.
    """
    pos = np.arange(length, dtype=np.float64)[:, None]           # (L, 1)
    two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]  # (1, D/2)
    angle = pos / 10000.0 ** (two_i / d_model)                   # (L, D/2)
    if halves:
        return np.concatenate([np.sin(angle), np.cos(angle)], axis=1)
    pe = np.empty((length, d_model))
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle)
    return pe


class Embedder:
    """The token embedding E (V, D), shared with the output projection (section 3.4), the positions and, with
    ``config.logits_bias``, the logits' bias."""

    def __init__(self, params: Params, c: Config, nx: Numerics):
        self.table, self.c, self.nx = params["embedding"], c, nx
        self.positions, self.bias = params.get("position_embedding"), params.get("logits_bias")

    def encode(self, ids: np.ndarray, start: int = 0) -> np.ndarray:
        """``E[ids] * sqrt(D) + PE[start:start+L]`` in fp32, rounded once (rule 3): (B, L) -> (B, L, D)."""
        nx, c, end = self.nx, self.c, start + ids.shape[1]
        if self.positions is not None:                                       # learned: the parameter's rows
            pe = self.positions[start:end]
        else:
            pe = nx.acc(positional_encoding(end, c.d_model, c.positions == "sinusoidal_halves")[start:])  # fp32
        scale = nx.acc(np.sqrt(c.d_model)) if c.scale_embedding else 1.0
        return nx.act(self.table[ids] * scale + pe)

    def decode(self, x: np.ndarray) -> np.ndarray:
        """Tied output projection x E^T (+ the logits bias): (B, n, D) -> (B, n, V) fp32 logits."""
        return logits(x, self.table, self.bias, nx=self.nx)


def scaled_dot_product_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray,
                                 nx: Numerics) -> np.ndarray:
    """softmax(Q K^T / sqrt(d_k)) V (equation 1, rule 4): q (B, L, H, K), k (B, H, M, K), v (B, H, M, C),
    mask (B|1, 1|L, M) True = may attend -> (B, L, H, C)."""
    # einsum sums in an order that follows the operands' memory layout: read k, v sequence-major.
    k, v = (np.ascontiguousarray(a.transpose(0, 2, 1, 3)) for a in (k, v))      # (B, M, H, K|C)
    scores = matmul_f32("bthk,bshk->bhts", q, k, nx=nx)                         # (B, H, L, M) fp32
    scores = nx.acc(scores * nx.acc(1.0 / np.sqrt(q.shape[-1])))
    scores = np.where(mask[:, None], scores, MASKED_SCORE)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))                     # max-subtracted softmax
    probs = nx.act(nx.acc(e / e.sum(axis=-1, keepdims=True)))                   # rounded before P V
    return nx.act(matmul_f32("bhts,bshc->bthc", probs, v, nx=nx))               # (B, L, H, C)


class MultiHeadAttention:
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O (section 3.2.2); with ``config.attention_bias`` each
    projection adds its bias."""

    def __init__(self, params: Params, prefix: str, nx: Numerics):
        self.w_q, self.w_k, self.w_v, self.w_o = (params[f"{prefix}.{n}"] for n in ("w_q", "w_k", "w_v", "w_o"))
        self.b_q, self.b_k, self.b_v, self.b_o = (params.get(f"{prefix}.{n}") for n in ("b_q", "b_k", "b_v", "b_o"))
        self.nx = nx

    def project_kv(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values of x (B, M, D): k (B, H, M, K), v (B, H, M, C)."""
        k, v = linear(x, self.w_k, self.b_k, nx=self.nx), linear(x, self.w_v, self.b_v, nx=self.nx)  # (B, M, H, *)
        return k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)

    def forward(self, x: np.ndarray, kv: tuple[np.ndarray, np.ndarray], mask: np.ndarray) -> np.ndarray:
        """Queries from x (B, L, D) over the projected ``kv``, mask (B|1, 1|L, M) -> (B, L, D)."""
        q = linear(x, self.w_q, self.b_q, nx=self.nx)                            # (B, L, H, K)
        return linear(scaled_dot_product_attention(q, *kv, mask, self.nx), self.w_o, self.b_o, nx=self.nx)


def activation(h: np.ndarray, name: str, nx: Numerics) -> np.ndarray:
    """The FFN's nonlinearity ``config.activation`` (``spec.config.ACTIVATIONS``) of the rounded hidden units
    h (B, L, F), exact and rounded once (rule 2)."""
    if name == "relu":
        return np.maximum(h, 0.0)
    if name == "gelu":                                                           # x Phi(x)
        return nx.act(0.5 * h * (1.0 + _erf(h / np.sqrt(2.0))))
    if name == "gelu_tanh":
        return nx.act(0.5 * h * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (h + 0.044715 * h**3))))
    if name == "silu":                                                           # x sigmoid(x)
        return nx.act(h / (1.0 + np.exp(-h)))
    raise ValueError(f"unknown activation {name!r}")


_erf = np.vectorize(math.erf, otypes=[np.float64])  # NumPy has no erf; math's is correctly rounded enough


class FeedForward:
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2 (equation 2, act the paper's ReLU by default): (B, L, D) -> (B, L, D)."""

    def __init__(self, params: Params, prefix: str, act: str, nx: Numerics):
        self.w_1, self.b_1, self.w_2, self.b_2 = (params[f"{prefix}.{n}"] for n in ("w_1", "b_1", "w_2", "b_2"))
        self.act, self.nx = act, nx

    def forward(self, x: np.ndarray) -> np.ndarray:
        h = linear(x, self.w_1, self.b_1, nx=self.nx)                            # (B, L, F)
        return linear(activation(h, self.act, self.nx), self.w_2, self.b_2, nx=self.nx)


class LayerNorm:
    """LayerNorm over D (Ba et al., 2016) with ``scale`` and ``bias``; statistics in fp32 or better (rule 6)."""

    def __init__(self, params: Params, prefix: str, eps: float, nx: Numerics):
        self.scale, self.bias, self.eps, self.nx = params[f"{prefix}.scale"], params[f"{prefix}.bias"], eps, nx

    def forward(self, x: np.ndarray) -> np.ndarray:
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
        return self.nx.act((x - mu) / np.sqrt(var + self.eps) * self.scale + self.bias)
