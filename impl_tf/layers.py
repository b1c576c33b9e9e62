"""The Transformer's parts as tf.Modules (Vaswani et al., 2017, section 3), under the numerics of ``spec.numerics``.

Every tf.Variable is named by its canonical parameter name (``spec.schema``), e.g.
``encoder.layers.0.self_attn.w_q``, and every module keeps that prefix in ``path``.

Products with a weight take bf16 operands, accumulate in fp32 and round once after the bias (``_tensordot``).
The eager bf16 ``tf.matmul`` rounds its output to bf16 (it differs from round-once on half the elements of a
(256, 512) . (512, 512) product), so it is never used. Two products do meet the contract, with the same
result up to the order of fp32 summation: (a) under XLA, ``tf.matmul(..., output_type=tf.float32)`` on bf16
operands, a dot with an fp32 accumulator and output; (b) an fp32 dot of the operands upcast to fp32 (the
product of two bf16 values is exact in fp32). Which is faster depends on the product's rows (``upcast_operands``):
(b) runs at the CPU's fp32 GEMM rate but converts the whole weight on every call, so it wins for many rows (a
teacher-forced forward, the encoder); (a) reads the weight at half the bytes, so it wins for few rows (a decode
step, where the weight's conversion would dominate). The choice is made per product from the static row count
that XLA compiles for; the figures behind the threshold are measured by ``nox -s bench``. Eager TensorFlow has
no kernel for (a), so eagerly the operands are upcast (b). Layers therefore run eagerly or inside
``tf.function(jit_compile=True)``.

Training (``impl_tf.train``) differentiates these same layers with a ``tf.GradientTape``; evaluation computes
exactly what it computed before. Parameters enter through ``weight``, a rounding to the activation dtype held in
fp32 with a straight-through gradient, so weight gradients are fp32: the master weights' (``spec.training``).
Three functions carry their own gradient: product (a), for which TensorFlow's gives bf16 operands fp32
cotangents, takes (b)'s; the softmax and LayerNorm's normalization take their Jacobians in one expression, as the
ideal backward of ``spec.backward`` does. Autodiff through their max, sums and statistics subtracts fp32 terms
that cancel: on the tiny fp32 training golden case it missed an Adam step whose gradient is 12 ``adam_eps`` by
half a step, and the losses after it by 20 fp32 ulps (allowed: 8); with these gradients 2.6.
Dropout (``Dropout``, section 5.4) acts only when a layer is given one (``dropout=None``: evaluation).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from spec.config import Config
from spec.numerics import MASKED_SCORE
from spec.recording import record

# The fewest rows (the product's M: the activation's elements over the contracted axis) at which (b), the fp32
# dot of upcast operands, beats (a), bf16 operands with an fp32 result (module docstring). Measured on an
# AVX-512 x86-64 CPU (TF 2.21, XLA) for (K, N) = (512, 512), (512, 2048), (2048, 512) and (512, 37000): (a) wins
# below 64 rows (a decode step: B or B * beam rows) at every shape, (b) from 256 rows (a forward: B * T rows),
# and they cross between; timings: ``nox -s bench``.
UPCAST_MIN_ROWS = 128


def upcast_operands(rows: int) -> bool:
    """Whether a product with ``rows`` rows runs as an fp32 dot of upcast operands (True) rather than as a dot
    of bf16 operands with an fp32 result (False). Same result either way, up to fp32 summation order."""
    return rows >= UPCAST_MIN_ROWS


def _matmul_fp32(a: tf.Tensor, b: tf.Tensor, transpose_b: bool = False) -> tf.Tensor:
    """``a @ b`` (batch dims broadcast) with an fp32 accumulator, returned in fp32 (module docstring).

    ``a`` is an activation; ``b`` a parameter, which enters in a's dtype (rule 0, ``weight``).
    """
    b = weight(b, a.dtype)  # fp32, holding b in a's dtype

    def upcast() -> tf.Tensor:
        return tf.matmul(tf.cast(a, tf.float32), b, transpose_b=transpose_b)                # (..., N) fp32

    @tf.custom_gradient
    def bf16_operands(a: tf.Tensor, b: tf.Tensor) -> tuple[tf.Tensor, Callable]:
        # TensorFlow's gradient of a product with an fp32 result gives its bf16 operands fp32 cotangents; the
        # upcast product computes the same function, so its gradient is this one's (fp32 for b, a's rounded once).
        def grad(dy: tf.Tensor) -> list[tf.Tensor]:
            with tf.GradientTape() as tape:
                tape.watch([a, b])
                y = tf.matmul(tf.cast(a, tf.float32), b, transpose_b=transpose_b)           # (..., N) fp32
            return tape.gradient(y, [a, b], output_gradients=dy)                            # a's shape, b's
        y = tf.matmul(a, tf.cast(b, a.dtype), transpose_b=transpose_b, output_type=tf.float32)  # XLA only
        return y, grad

    if a.dtype == tf.float32 or tf.executing_eagerly():
        return upcast()
    if a.shape[:-1].is_fully_defined():
        return upcast() if upcast_operands(math.prod(a.shape[:-1])) else bf16_operands(a, b)
    # Traced for any shape (a shape-polymorphic tf.function): XLA compiles each concrete shape, where the row
    # count is a constant, so it keeps only the branch taken (its conditional simplifier inlines it).
    rows = tf.reduce_prod(tf.shape(a)[:-1])
    return tf.cond(rows >= UPCAST_MIN_ROWS, upcast, lambda: bf16_operands(a, b))


def _tensordot(x: tf.Tensor, w: tf.Tensor, axes: int = 1, bias: tf.Tensor | None = None) -> tf.Tensor:
    """The last ``axes`` axes of x contracted with the first of w, plus bias: fp32 accumulator, rounded once.

    x (..., N1..Na), w (N1..Na, M1..Mb) -> (..., M1..Mb) in x's dtype, like ``np.tensordot(x, w, axes)``.
    """
    batch = tf.shape(x)[:-axes]
    y = _matmul_fp32(tf.reshape(x, tf.concat([batch, [-1]], 0)), tf.reshape(w, [math.prod(w.shape[:axes]), -1]))
    if bias is not None:
        y += weight(bias, x.dtype)
    return tf.cast(tf.reshape(y, tf.concat([batch, w.shape[axes:]], 0)), x.dtype)


def _variable(params: dict[str, np.ndarray], name: str) -> tf.Variable:
    """The canonical parameter ``name`` as a tf.Variable of its stored dtype, named after it."""
    return tf.Variable(params[name], name=name, trainable=True)


def weight(p: tf.Tensor | tf.Variable, dtype: tf.DType) -> tf.Tensor:
    """A parameter as it enters the computation (rule 0): rounded to ``dtype``, held in fp32 (same shape).

    Differentiable as a straight-through rounding: its fp32 gradient passes to ``p`` unchanged, the gradient of
    an fp32 master weight (``spec.training``), where autodiff of the casts would round it to ``dtype`` (or to a
    bf16 parameter's dtype).
    """
    @tf.custom_gradient
    def rounded(p: tf.Tensor) -> tuple[tf.Tensor, Callable]:
        return tf.cast(tf.cast(p, dtype), tf.float32), lambda dy: dy                      # p's shape
    return rounded(tf.convert_to_tensor(p))


# ----------------------------------------------------------------- dropout

class Dropout:
    """Inverted dropout (section 5.4) for one training forward, at ``rate`` with masks from stateless draws.

    ``seed`` (2,) int64 is the step's (``impl_tf.train_step`` draws it from the train state's
    ``tf.random.Generator``); each call, one dropout site of the traced forward, folds its own seed from it, so
    masks never touch TensorFlow's global RNG. Layers take ``dropout=None`` in evaluation: the identity (rule 8).
    """

    def __init__(self, rate: float, seed: tf.Tensor):
        self.rate, self.seed, self.sites = rate, seed, 0

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        """x (...) -> each element kept with probability 1 - rate and scaled by 1 / (1 - rate) in fp32, rounded
        once to x's dtype; zero otherwise."""
        if self.rate == 0.0:
            return x
        self.sites += 1
        seed = tf.random.experimental.stateless_fold_in(self.seed, self.sites)      # (2,) this site's own
        keep = tf.random.stateless_uniform(tf.shape(x), seed) >= self.rate          # x's shape, True = kept
        return tf.where(keep, tf.cast(tf.cast(x, tf.float32) / (1.0 - self.rate), x.dtype), tf.zeros_like(x))


def dropped(x: tf.Tensor, dropout: Dropout | None) -> tf.Tensor:
    """``dropout(x)`` in training, x itself in evaluation (``dropout`` None)."""
    return x if dropout is None else dropout(x)


# ----------------------------------------------------------------- embedding

def positional_encoding(length: int, d_model: int) -> tf.Tensor:
    """Sinusoidal table (length, D) float32 (section 3.5), interleaved, positions from 0.

    ``PE[pos, 2i] = sin(pos / 10000^(2i/D))``, ``PE[pos, 2i+1] = cos(...)``; computed in float64 and
    rounded to float32 once, so the table is the exact one rounded.
    """
    pos = tf.range(length, dtype=tf.float64)[:, None]             # (L, 1)
    two_i = tf.range(0, d_model, 2, dtype=tf.float64)[None, :]    # (1, D/2)
    angle = pos / 10000.0 ** (two_i / d_model)                    # (L, D/2)
    pe = tf.stack([tf.sin(angle), tf.cos(angle)], axis=-1)        # (L, D/2, 2): sin, cos interleaved
    return tf.cast(tf.reshape(pe, [length, d_model]), tf.float32)


class Embedding(tf.Module):
    """``E[ids] * sqrt(D) + PE`` (section 3.4, 3.5), shared by source, target and the output projection."""

    def __init__(self, c: Config, params: dict[str, np.ndarray]):
        super().__init__(name="embedding")
        self.path = "embedding"
        self.embedding = _variable(params, "embedding")                   # (V, D) in param_dtype
        self.dtype = tf.as_dtype(c.dtype)                                 # the activation dtype, from the config
        self.pe = positional_encoding(c.max_len, c.d_model)               # (max_len, D) fp32
        self.scale = tf.constant(math.sqrt(c.d_model), tf.float32)

    def __call__(self, ids: tf.Tensor, start: tf.Tensor | int = 0, dropout: Dropout | None = None) -> tf.Tensor:
        """ids (B, L) int at positions ``start...`` -> (B, L, D), fp32 sum rounded once to the activation dtype,
        then ``dropout`` in training."""
        rows = weight(tf.gather(self.embedding, ids), self.dtype)                # rule 0: in the activation dtype
        x = rows * self.scale                                                    # (B, L, D) fp32
        pe = tf.gather(self.pe, start + tf.range(tf.shape(ids)[1]))              # (L, D) fp32
        return dropped(tf.cast(x + pe, self.dtype), dropout)

    def logits(self, h: tf.Tensor) -> tf.Tensor:
        """Tied output projection ``h E^T`` (section 3.4): (B, n, D) -> (B, n, V) float32, never rounded."""
        return _matmul_fp32(h, self.embedding, transpose_b=True)                  # (B, n, V)


# ----------------------------------------------------------------- attention

def scaled_dot_product_attention(q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """softmax(Q K^T / sqrt(d_k)) V (equation 1), in the spec's layout.

    q (B, T, H, K), k (B, S, H, K), v (B, S, H, C) in the activation dtype; mask bool broadcastable to
    (B, H, T, S), True = may attend. Returns (B, T, H, C) in q's dtype. ``MultiHeadAttention`` calls
    ``attention`` on heads-major keys and values instead.
    """
    return attention(q, tf.transpose(k, [0, 2, 1, 3]), tf.transpose(v, [0, 2, 1, 3]), mask)


def attention(q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """``scaled_dot_product_attention`` over heads-major k (B, H, S, K), v (B, H, S, C), the KV cache's layout:
    -> (B, T, H, C).

    Scores, masking and the max-subtracted softmax are fp32; masked keys get ``MASKED_SCORE`` (finite, so a
    fully masked row stays finite); probabilities are rounded to the activation dtype before ``P V``.
    TensorFlow has no fused attention kernel outside Keras; under ``jit_compile`` XLA fuses this plain path.
    """
    scale = tf.constant(1.0 / math.sqrt(q.shape[-1]), tf.float32)
    scores = tf.einsum("bthk,bhsk->bhts", tf.cast(q, tf.float32), tf.cast(k, tf.float32)) * scale  # (B, H, T, S)
    scores = tf.where(mask, scores, MASKED_SCORE)
    probs = tf.cast(_softmax(scores), q.dtype)                                                     # (B, H, T, S)
    out = tf.einsum("bhts,bhsc->bthc", tf.cast(probs, tf.float32), tf.cast(v, tf.float32))         # (B, T, H, C)
    return tf.cast(out, q.dtype)


@tf.custom_gradient
def _softmax(scores: tf.Tensor) -> tuple[tf.Tensor, Callable]:
    """Max-subtracted fp32 softmax over S of scores (B, H, T, S), differentiable by its Jacobian in one
    expression, ``p * (dp - sum(dp * p))``, as TensorFlow's own softmax is (module docstring)."""
    e = tf.exp(scores - tf.reduce_max(scores, axis=-1, keepdims=True))                    # (B, H, T, S) fp32
    probs = e / tf.reduce_sum(e, axis=-1, keepdims=True)                                  # (B, H, T, S)
    return probs, lambda dp: probs * (dp - tf.reduce_sum(dp * probs, axis=-1, keepdims=True))  # (B, H, T, S)


class MultiHeadAttention(tf.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O (section 3.2.2), no biases.

    Variables ``w_q``, ``w_k`` (D, H, K), ``w_v`` (D, H, C), ``w_o`` (H, C, D).
    """

    def __init__(self, params: dict[str, np.ndarray], path: str):
        super().__init__(name="multi_head_attention")
        self.path = path
        self.w_q, self.w_k = _variable(params, f"{path}.w_q"), _variable(params, f"{path}.w_k")    # (D, H, K)
        self.w_v, self.w_o = _variable(params, f"{path}.w_v"), _variable(params, f"{path}.w_o")  # (D, H, C), (H, C, D)

    def key_value(self, x_kv: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Key and value projections, heads-major as the KV cache holds them: (B, S, D) -> k (B, H, S, K),
        v (B, H, S, C)."""
        return tuple(tf.transpose(_tensordot(x_kv, w), [0, 2, 1, 3]) for w in (self.w_k, self.w_v))

    def attend(self, x_q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
        """Query projection, attention over heads-major k (B, H, S, K), v (B, H, S, C) computed earlier (the KV
        cache, cross-attention), output projection: (B, T, D) -> (B, T, D)."""
        q = _tensordot(x_q, self.w_q)                                     # (B, T, H, K)
        o = attention(q, k, v, mask)                                      # (B, T, H, C)
        return _tensordot(o, self.w_o, axes=2)                            # (B, T, D)

    def __call__(self, x_q: tf.Tensor, x_kv: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
        """x_q (B, T, D) attends over x_kv (B, S, D) under mask (B, 1, T|1, S) -> (B, T, D)."""
        return self.attend(x_q, *self.key_value(x_kv), mask)


# ----------------------------------------------------------------- FFN, norm, residual

class FeedForward(tf.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (equation 2): (B, L, D) -> (B, L, D), hidden (B, L, F)."""

    def __init__(self, params: dict[str, np.ndarray], path: str):
        super().__init__(name="feed_forward")
        self.path = path
        self.w_1, self.b_1 = _variable(params, f"{path}.w_1"), _variable(params, f"{path}.b_1")    # (D, F), (F,)
        self.w_2, self.b_2 = _variable(params, f"{path}.w_2"), _variable(params, f"{path}.b_2")    # (F, D), (D,)

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        h = tf.nn.relu(_tensordot(x, self.w_1, bias=self.b_1))           # (B, L, F)
        return _tensordot(h, self.w_2, bias=self.b_2)                    # (B, L, D)


class LayerNorm(tf.Module):
    """LayerNorm over D (Ba et al., 2016) with ``scale`` and ``bias``: statistics in fp32, result rounded once."""

    def __init__(self, c: Config, params: dict[str, np.ndarray], path: str):
        super().__init__(name="layer_norm")
        self.path = path
        self.eps = c.layer_norm_eps
        self.scale, self.bias = _variable(params, f"{path}.scale"), _variable(params, f"{path}.bias")

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        """(..., D) -> (..., D) in x's dtype."""
        scale, bias = (weight(p, x.dtype) for p in (self.scale, self.bias))  # rule 0
        y = _normalized(tf.cast(x, tf.float32), self.eps) * scale + bias
        return tf.cast(y, x.dtype)


def _normalized(x: tf.Tensor, eps: float) -> tf.Tensor:
    """``(x - mean) / sqrt(var + eps)`` over the last axis of fp32 x (..., D), differentiable by LayerNorm's
    Jacobian in one expression (module docstring)."""
    @tf.custom_gradient
    def normalized(x: tf.Tensor) -> tuple[tf.Tensor, Callable]:
        mu = tf.reduce_mean(x, axis=-1, keepdims=True)                               # (..., 1)
        sigma = tf.sqrt(tf.reduce_mean(tf.square(x - mu), axis=-1, keepdims=True) + eps)  # (..., 1)
        xhat = (x - mu) / sigma                                                      # (..., D)

        def grad(dxhat: tf.Tensor) -> tf.Tensor:
            mean = lambda t: tf.reduce_mean(t, axis=-1, keepdims=True)  # noqa: E731
            return (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) / sigma        # (..., D)
        return xhat, grad
    return normalized(x)


def residual_add(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    """``x + y`` of two activations, rounded once to their dtype (contract rule 5)."""
    return tf.cast(tf.cast(x, tf.float32) + tf.cast(y, tf.float32), x.dtype)


class SublayerConnection(tf.Module):
    """Residual connection around a sublayer (section 5.4), with dropout on the sublayer's output in training.

    Post-LN (paper): ``LayerNorm(x + Dropout(Sublayer(x)))``; pre-LN (``config.norm_first``):
    ``x + Dropout(Sublayer(LayerNorm(x)))``. Records the sublayer's output and the result as ``<name>`` and
    ``<name>.residual``, ``<name>`` the last part of ``path`` (e.g. "self_attn"): its layer's ``scope`` supplies
    the rest.
    """

    def __init__(self, norm: LayerNorm, norm_first: bool, path: str):
        super().__init__(name="sublayer_connection")
        self.norm, self.norm_first, self.path = norm, norm_first, path
        self.record_name = path.rsplit(".", 1)[-1]

    def __call__(self, x: tf.Tensor, sublayer: Callable[[tf.Tensor], tf.Tensor], dropout: Dropout | None = None
                 ) -> tf.Tensor:
        """x (B, L, D) -> (B, L, D); ``dropout`` in training, None in evaluation."""
        if self.norm_first:
            y = record(self.record_name, sublayer(self.norm(x)))
            out = residual_add(x, dropped(y, dropout))
        else:
            y = record(self.record_name, sublayer(x))
            out = self.norm(residual_add(x, dropped(y, dropout)))
        return record(f"{self.record_name}.residual", out)


# ----------------------------------------------------------------- layers

class EncoderLayer(tf.Module):
    """Self-attention then FFN, each in a sublayer connection (section 3.1): (B, S, D) -> (B, S, D)."""

    def __init__(self, c: Config, params: dict[str, np.ndarray], path: str):
        super().__init__(name="encoder_layer")
        self.path = path
        self.self_attn = MultiHeadAttention(params, f"{path}.self_attn")
        self.self_attn_norm = LayerNorm(c, params, f"{path}.self_attn_norm")
        self.ffn = FeedForward(params, f"{path}.ffn")
        self.ffn_norm = LayerNorm(c, params, f"{path}.ffn_norm")
        self.self_attn_sublayer = SublayerConnection(self.self_attn_norm, c.norm_first, f"{path}.self_attn")
        self.ffn_sublayer = SublayerConnection(self.ffn_norm, c.norm_first, f"{path}.ffn")

    def __call__(self, x: tf.Tensor, mask: tf.Tensor, dropout: Dropout | None = None) -> tf.Tensor:
        """x (B, S, D), key padding mask (B, 1, 1, S) -> (B, S, D); ``dropout`` in training, None in evaluation."""
        x = self.self_attn_sublayer(x, lambda h: self.self_attn(h, h, mask), dropout)
        return self.ffn_sublayer(x, self.ffn, dropout)


def write_kv(cache: tf.Tensor, new: tf.Tensor, start: tf.Tensor) -> tf.Tensor:
    """Write ``new`` (B, n) or (B, H, n, K) into a preallocated ``cache`` (B, P) or (B, H, P, K) at positions
    ``start...start+n-1``: a scatter of whole rows (XLA updates a loop-carried cache in place)."""
    lead = tf.shape(new)[:2] if new.shape.rank == 2 else tf.shape(new)[:3]               # (B, n) or (B, H, n)
    grid = tf.meshgrid(*(tf.range(d) for d in tf.unstack(lead)), indexing="ij")
    grid[-1] += start                                                                    # positions from start
    return tf.tensor_scatter_nd_update(cache, tf.stack(grid, axis=-1), new)


class DecoderLayer(tf.Module):
    """Masked self-attention with a KV cache, cross-attention, FFN (section 3.1): (B, n, D) -> (B, n, D)."""

    def __init__(self, c: Config, params: dict[str, np.ndarray], path: str):
        super().__init__(name="decoder_layer")
        self.path = path
        self.self_attn = MultiHeadAttention(params, f"{path}.self_attn")
        self.self_attn_norm = LayerNorm(c, params, f"{path}.self_attn_norm")
        self.cross_attn = MultiHeadAttention(params, f"{path}.cross_attn")
        self.cross_attn_norm = LayerNorm(c, params, f"{path}.cross_attn_norm")
        self.ffn = FeedForward(params, f"{path}.ffn")
        self.ffn_norm = LayerNorm(c, params, f"{path}.ffn_norm")
        self.self_attn_sublayer = SublayerConnection(self.self_attn_norm, c.norm_first, f"{path}.self_attn")
        self.cross_attn_sublayer = SublayerConnection(self.cross_attn_norm, c.norm_first, f"{path}.cross_attn")
        self.ffn_sublayer = SublayerConnection(self.ffn_norm, c.norm_first, f"{path}.ffn")

    def __call__(self, y: tf.Tensor, self_kv: tuple[tf.Tensor, tf.Tensor], start: tf.Tensor, self_mask: tf.Tensor,
                 memory_kv: tuple[tf.Tensor, tf.Tensor], memory_mask: tf.Tensor, dropout: Dropout | None = None
                 ) -> tuple[tf.Tensor, tuple[tf.Tensor, tf.Tensor]]:
        """n new tokens at positions ``start...`` against this layer's cache.

        y (B, n, D); self_kv: preallocated (k (B, H, T_max, K), v (B, H, T_max, C)) holding positions
        < start; self_mask (B, 1, n, T_max) (causal and key padding, False beyond the written positions);
        memory_kv: cross-attention (k (B, H, S, K), v (B, H, S, C)), computed once per source; memory_mask
        (B, 1, 1, S); ``dropout`` in training, None in evaluation. Returns (B, n, D) and self_kv with the new
        keys/values written at ``start...``.
        """
        new_kv = []

        def self_attn(h):
            k, v = self.self_attn.key_value(h)                                       # (B, H, n, K), (B, H, n, C)
            new_kv.extend(write_kv(cache, new, start) for cache, new in zip(self_kv, (k, v), strict=True))
            return self.self_attn.attend(h, *new_kv, self_mask)

        y = self.self_attn_sublayer(y, self_attn, dropout)
        y = self.cross_attn_sublayer(y, lambda h: self.cross_attn.attend(h, *memory_kv, memory_mask), dropout)
        y = self.ffn_sublayer(y, self.ffn, dropout)
        return y, tuple(new_kv)
