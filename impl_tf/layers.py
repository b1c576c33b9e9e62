"""The Transformer's layers as tf.Modules (Vaswani et al., 2017, section 3), under the numerics of ``spec.numerics``.

Every tf.Variable is named by its canonical parameter name (``spec.schema``), e.g. ``encoder.layers.0.self_attn.w_q``.
Products go through ``impl_tf.numerics``; layers run eagerly or inside ``tf.function(jit_compile=True)``.
The softmax and LayerNorm's normalization carry their own gradient: their Jacobians in one expression, as the
ideal backward of ``spec.backward`` does, where autodiff through their max, sums and statistics subtracts fp32
terms that cancel (docs/decisions-tf.md). Dropout (section 5.4) draws from the ``rng`` a forward is given, a
stateless seed (None: evaluation). The encoder and decoder layers built of these are ``impl_tf.stacks``'.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from impl_tf.numerics import linear, logits, round_to
from spec.config import Config
from spec.numerics import MASKED_SCORE
from spec.recording import record, scoped


def dropout(x: tf.Tensor, site: str, rate: float, rng: tf.Tensor | None) -> tf.Tensor:
    """Inverted dropout at a dropout site (section 5.4, ``spec.shapes.dropout_sites``): x (B, L, D) -> (B, L, D),
    each element kept with probability 1 - rate and divided by 1 - rate in fp32 (the divisor rounded to fp32), the
    quotient rounded once to x's dtype; the identity without ``rng`` (evaluation) or at rate 0. Records the result
    as ``site`` and, with dropout, the keep mask (bool) as ``<site>.keep``.

    ``rng``: a stateless seed, (2,) int64. Each site draws from its own seed, the seed folded with its scoped name,
    so every site of a forward draws apart from the others without a counter threaded through the layers, and the
    same seed draws the same masks (TensorFlow's global RNG is never touched).
    """
    if rng is None or rate == 0.0:
        return record(site, x)
    seed = tf.random.experimental.stateless_fold_in(rng, zlib.crc32(scoped(site).encode()), alg="philox")
    keep = record(f"{site}.keep", tf.random.stateless_uniform(tf.shape(x), seed, alg="philox") >= rate)
    # Grappler and XLA rewrite a division by a scalar constant as a product with its reciprocal, which misses the
    # rounded quotient for about a quarter of the elements: a divisor of x's shape keeps the division.
    divisor = tf.where(keep, tf.constant(1.0 - rate, tf.float32), 1.0)
    return record(site, tf.where(keep, tf.cast(tf.cast(x, tf.float32) / divisor, x.dtype), tf.zeros_like(x)))


def positional_encoding(length: int, d_model: int, halves: bool = False) -> tf.Tensor:
    """Sinusoidal table (L, D) float32 (section 3.5), interleaved, positions from 0.

    ``PE[pos, 2i] = sin(pos / 10000^(2i/D))``, ``PE[pos, 2i+1] = cos(...)``; computed in float64 and rounded to
    float32 once, so the table is the exact one rounded. With ``halves`` (``config.positions="sinusoidal_halves"``)
    the same D/2 sines fill the first half and the cosines the second.
    """
    pos = tf.range(length, dtype=tf.float64)[:, None]             # (L, 1)
    two_i = tf.range(0, d_model, 2, dtype=tf.float64)[None, :]    # (1, D/2)
    angle = pos / 10000.0 ** (two_i / d_model)                    # (L, D/2)
    if halves:
        return tf.cast(tf.concat([tf.sin(angle), tf.cos(angle)], axis=1), tf.float32)
    pe = tf.stack([tf.sin(angle), tf.cos(angle)], axis=-1)        # (L, D/2, 2): sin, cos interleaved
    return tf.cast(tf.reshape(pe, [length, d_model]), tf.float32)


class Embedder(tf.Module):
    """The shared embedding table (V, D): ``E[ids] * sqrt(D) + PE`` on the way in (sections 3.4, 3.5), the tied
    output projection ``h E^T`` on the way out (section 3.4).

    The config's options: ``positions`` picks PE, the paper's interleaved sinusoids, their halves layout, or the
    learned table ``positions`` (max_len, D); without ``scale_embedding`` the factor sqrt(D) is 1; with
    ``logits_bias`` the bias ``bias`` (V) is added to the logits. ``positions`` and ``bias`` are None when absent.
    """

    def __init__(self, config: Config, params: dict[str, np.ndarray]):
        super().__init__(name="embedder")
        c = config
        self.table = tf.Variable(params["embedding"], name="embedding", trainable=True)  # (V, D) in param_dtype
        self.positions, self.bias = _optional_variables(params, "position_embedding", "logits_bias")
        self.dtype = tf.as_dtype(c.dtype)                                 # the activation dtype, from the config
        self.pe = None if self.positions is not None else positional_encoding(  # (max_len, D) fp32
            c.max_len, c.d_model, c.positions == "sinusoidal_halves")
        self.scale = tf.constant(math.sqrt(c.d_model), tf.float32) if c.scale_embedding else None

    def encode(self, ids: tf.Tensor, start: tf.Tensor | int = 0) -> tf.Tensor:
        """ids (B, L) int at positions ``start...`` -> (B, L, D), the fp32 sum rounded once to the activation dtype."""
        x = round_to(tf.gather(self.table, ids), self.dtype)                     # (B, L, D) fp32, rule 0
        if self.scale is not None:
            x *= self.scale
        at = start + tf.range(tf.shape(ids)[1])                                  # (L,) positions
        pe = tf.gather(self.pe, at) if self.positions is None else round_to(tf.gather(self.positions, at), self.dtype)
        return tf.cast(x + pe, self.dtype)                                       # pe (L, D) fp32

    def decode(self, x: tf.Tensor) -> tf.Tensor:
        """(B, L, D) -> logits (B, L, V) float32 (plus the logits bias, if any), never rounded."""
        return logits(x, self.table, self.bias)


def scaled_dot_product_attention(q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """softmax(Q K^T / sqrt(d_k)) V (equation 1): q (B, L, H, K), heads-major k (B, H, M, K), v (B, H, M, C) as
    the KV cache holds them, mask bool broadcastable to (B, H, L, M), True = may attend -> (B, L, H, C) in q's dtype.

    Scores, masking and the max-subtracted softmax are fp32; masked keys get ``MASKED_SCORE`` (finite, so a fully
    masked row stays finite); probabilities are rounded to the activation dtype before ``P V``. TensorFlow has no
    fused attention kernel outside Keras; under ``jit_compile`` XLA fuses this plain path.
    """
    @tf.custom_gradient
    def softmax(scores: tf.Tensor) -> tuple[tf.Tensor, Callable]:
        # differentiable by its Jacobian in one expression, p * (dp - sum(dp * p)), as TensorFlow's own softmax
        e = tf.exp(scores - tf.reduce_max(scores, axis=-1, keepdims=True))                    # (B, H, L, M) fp32
        probs = e / tf.reduce_sum(e, axis=-1, keepdims=True)
        return probs, lambda dp: probs * (dp - tf.reduce_sum(dp * probs, axis=-1, keepdims=True))

    scale = tf.constant(1.0 / math.sqrt(q.shape[-1]), tf.float32)
    scores = tf.einsum("bthk,bhsk->bhts", tf.cast(q, tf.float32), tf.cast(k, tf.float32)) * scale  # (B, H, L, M)
    probs = tf.cast(softmax(tf.where(mask, scores, MASKED_SCORE)), q.dtype)                        # (B, H, L, M)
    out = tf.einsum("bhts,bhsc->bthc", tf.cast(probs, tf.float32), tf.cast(v, tf.float32))         # (B, L, H, C)
    return tf.cast(out, q.dtype)


class MultiHeadAttention(tf.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O (section 3.2.2); the projections have no bias, as in the
    paper, unless ``config.attention_bias``, where each adds its own.

    Variables ``w_q``, ``w_k`` (D, H, K), ``w_v`` (D, H, C), ``w_o`` (H, C, D); biases ``b_q``, ``b_k`` (H, K),
    ``b_v`` (H, C), ``b_o`` (D), None when absent.
    """

    def __init__(self, config: Config, params: dict[str, np.ndarray], name: str):
        super().__init__(name="multi_head_attention")
        self.w_q, self.w_k, self.w_v, self.w_o = _variables(params, name, "w_q", "w_k", "w_v", "w_o")
        self.b_q, self.b_k, self.b_v, self.b_o = (_variables(params, name, "b_q", "b_k", "b_v", "b_o")
                                                  if config.attention_bias else (None,) * 4)

    def project_kv(self, x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Key and value projections, heads-major: x (B, M, D) -> k (B, H, M, K), v (B, H, M, C)."""
        return tuple(tf.transpose(linear(x, w, b), [0, 2, 1, 3]) for w, b in ((self.w_k, self.b_k),
                                                                               (self.w_v, self.b_v)))

    def forward(self, x: tf.Tensor, kv: tuple[tf.Tensor, tf.Tensor], mask: tf.Tensor) -> tf.Tensor:
        """Queries from x (B, L, D) attend over ``project_kv``'s kv under mask (B, 1, L|1, M) -> (B, L, D)."""
        q = linear(x, self.w_q, self.b_q)                                 # (B, L, H, K)
        o = scaled_dot_product_attention(q, *kv, mask)                    # (B, L, H, C)
        return linear(o, self.w_o, self.b_o, n_in=2)                      # (B, L, D)


def activation(h: tf.Tensor, name: str) -> tf.Tensor:
    """The FFN's nonlinearity ``config.activation`` (``spec.config.ACTIVATIONS``) of the rounded hidden units
    h (B, L, F): ReLU is exact in h's dtype; the others are computed in fp32 and rounded once to h's dtype."""
    if name == "relu":
        return tf.nn.relu(h)
    fn = {"gelu": functools.partial(tf.nn.gelu, approximate=False),   # x Phi(x), by erf
          "gelu_tanh": functools.partial(tf.nn.gelu, approximate=True),
          "silu": tf.nn.silu}[name]                                    # x sigmoid(x)
    return tf.cast(fn(tf.cast(h, tf.float32)), h.dtype)


class FeedForward(tf.Module):
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2 (equation 2, ``act`` the paper's ReLU by default, ``activation``):
    (B, L, D) -> (B, L, D), hidden (B, L, F)."""

    def __init__(self, config: Config, params: dict[str, np.ndarray], name: str):
        super().__init__(name="feed_forward")
        self.w_1, self.b_1, self.w_2, self.b_2 = _variables(params, name, "w_1", "b_1", "w_2", "b_2")
        self.act = config.activation

    def forward(self, x: tf.Tensor) -> tf.Tensor:
        h = activation(linear(x, self.w_1, self.b_1), self.act)         # (B, L, F)
        return linear(h, self.w_2, self.b_2)                             # (B, L, D)


class LayerNorm(tf.Module):
    """LayerNorm over D (Ba et al., 2016) with ``scale`` and ``bias``: statistics in fp32, result rounded once."""

    def __init__(self, config: Config, params: dict[str, np.ndarray], name: str):
        super().__init__(name="layer_norm")
        self.eps = config.layer_norm_eps
        self.scale, self.bias = _variables(params, name, "scale", "bias")

    def forward(self, x: tf.Tensor) -> tf.Tensor:
        """(..., D) -> (..., D) in x's dtype."""
        @tf.custom_gradient
        def normalized(x: tf.Tensor) -> tuple[tf.Tensor, Callable]:
            # (x - mean) / sqrt(var + eps) of fp32 x (..., D), differentiable by LayerNorm's Jacobian in one expression
            mu = tf.reduce_mean(x, axis=-1, keepdims=True)                                       # (..., 1)
            sigma = tf.sqrt(tf.reduce_mean(tf.square(x - mu), axis=-1, keepdims=True) + self.eps)  # (..., 1)
            xhat = (x - mu) / sigma                                                              # (..., D)

            def grad(dxhat: tf.Tensor) -> tf.Tensor:
                mean = lambda t: tf.reduce_mean(t, axis=-1, keepdims=True)  # noqa: E731
                return (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) / sigma                # (..., D)
            return xhat, grad

        scale, bias = (round_to(p, x.dtype) for p in (self.scale, self.bias))  # rule 0
        return tf.cast(normalized(tf.cast(x, tf.float32)) * scale + bias, x.dtype)


def _variables(params: dict[str, np.ndarray], prefix: str, *names: str) -> list[tf.Variable]:
    """The canonical parameters ``prefix.name`` as tf.Variables of their stored dtype, named after them."""
    return [tf.Variable(params[f"{prefix}.{n}"], name=f"{prefix}.{n}", trainable=True) for n in names]


def _optional_variables(params: dict[str, np.ndarray], *names: str) -> list[tf.Variable | None]:
    """The top-level parameters ``names`` that a config option adds, as ``_variables``; None for those it has not."""
    return [tf.Variable(params[n], name=n, trainable=True) if n in params else None for n in names]


def residual_add(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    """``x + y`` of two activations, rounded once to their dtype (contract rule 5)."""
    return tf.cast(tf.cast(x, tf.float32) + tf.cast(y, tf.float32), x.dtype)


def write_kv(cache: tf.Tensor, new: tf.Tensor, start: tf.Tensor | int) -> tf.Tensor:
    """Write ``new`` (B, n) or (B, H, n, K) into a preallocated ``cache`` (B, P) or (B, H, P, K) at positions
    ``start...start+n-1``: a scatter of whole rows (XLA updates a loop-carried cache in place)."""
    lead = tf.shape(new)[:2] if new.shape.rank == 2 else tf.shape(new)[:3]               # (B, n) or (B, H, n)
    grid = tf.meshgrid(*(tf.range(d) for d in tf.unstack(lead)), indexing="ij")
    grid[-1] += start                                                                    # positions from start
    return tf.tensor_scatter_nd_update(cache, tf.stack(grid, axis=-1), new)
