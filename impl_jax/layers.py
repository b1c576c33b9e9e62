"""The Transformer's layers as pure JAX functions of (parameter subtree, activations) (Vaswani et al., 2017).

Numerics follow ``spec.numerics``: in bf16 mode every matrix product takes bf16
operands, accumulates in fp32 (``preferred_element_type``) and is rounded to
bf16 once, after its bias; attention scores, softmax and LayerNorm statistics
stay fp32. In fp32 mode the same code runs in fp32 with ``Precision.HIGHEST``
so no product runs as TF32 or bf16 passes on an accelerator.

Layers ``record`` named intermediates (``spec.shapes.intermediates``, ``spec.recording``); they are
kept only inside a ``recording`` block, by the name joined to the enclosing
``scope``s. Under ``jit`` this happens at trace time: the traced function opens
the block and returns the dict of tracers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from spec.config import Config
from spec.numerics import MASKED_SCORE
from spec.recording import record

Params = dict
F32 = jnp.float32

# XLA may keep a value in fp32 across a bf16 rounding the program asks for ("excess precision", on by default): it
# skipped the rounding of residual sums before LayerNorm (rule 5), so 90 to 186 of the 256 elements of each
# residual and layer output of a tiny bf16 encoder differed from the same operations run one by one, and in
# training a ReLU input near zero could land on the other side. Every jit of impl_jax compiles with it off; a
# caller who jits the model in a jit of their own passes these options to it too (``jax.jit(f,
# compiler_options=impl_jax.layers.XLA_OPTIONS)``): JAX takes compiler options from the outermost jit only.
XLA_OPTIONS = {"xla_allow_excess_precision": False}


def jit(fun: Callable, **kwargs) -> Callable:
    """``jax.jit(fun, **kwargs)`` compiled with ``XLA_OPTIONS`` when called at the top level; inside a caller's
    trace it is traced into the caller's program, whose jit decides the options (JAX refuses them nested)."""
    compiled, nested = jax.jit(fun, compiler_options=XLA_OPTIONS, **kwargs), jax.jit(fun, **kwargs)

    @functools.wraps(fun)
    def call(*args, **kw):
        traced = any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kw)))
        return (nested if traced else compiled)(*args, **kw)
    call._cache_size = compiled._cache_size  # programs compiled at the top level (the tests count them)
    return call


# A product of two bf16 values is exact in fp32, so an fp32 product of bf16 operands upcast to fp32 (fp32
# accumulator, fp32 result) is the contract's product exactly as a bf16-operand dot with an fp32 accumulator is
# (up to the order of the fp32 sums, which the contract leaves free). Which one is faster depends on the shape.
# On an x86-64 CPU (XLA CPU) the bf16-operand dot runs well below the fp32 dot's rate on compute-bound products,
# while the upcast costs a pass over both operands on every call, the whole weight matrix or KV cache included.
# So products with many rows (M, per matrix of a batched product: the teacher-forced forward, the encoder) are
# faster upcast, and few-row products (a decode step's projections, logits and attention over the cache, where
# reading the other operand dominates) are faster with bf16 operands. The crossover, measured on (M, 512) x
# (512, 512 | 2048 | 37000) and (M, 2048) x (2048, 512) products, lies near M = 256 rows for every shape; the
# timings are in the bench report (``nox -s bench``). The choice is made at trace time from static shapes.
UPCAST_MIN_ROWS = 256


def upcast_operands(rows: int, dtype: jnp.dtype) -> bool:
    """Whether a product whose matrices have ``rows`` rows (M; batch axes excluded) and operands in ``dtype``
    runs as an fp32 product of upcast operands: bf16 with ``rows >= UPCAST_MIN_ROWS``.

    Either way the result is the contract's (the comment above); only the speed differs.
    """
    return jnp.dtype(dtype) == jnp.bfloat16 and rows >= UPCAST_MIN_ROWS


def einsum_f32(eq: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """einsum with fp32 accumulation and result; HIGHEST pins fp32 operands to true fp32 products.

    bf16 operands are upcast to fp32 first where ``upcast_operands`` says it is faster (same result), and so is
    a bf16 activation whose weight is held in fp32 (``impl_jax.model.weights_f32``: bf16 values, exact in fp32).
    """
    lhs, rhs = eq.split("->")[0].split(",")
    rows = math.prod(n for axis, n in zip(lhs, a.shape, strict=True) if axis not in rhs)  # M: a's free axes
    if a.dtype != b.dtype or upcast_operands(rows, a.dtype):
        a, b = a.astype(F32), b.astype(F32)
    return jnp.einsum(eq, a, b, preferred_element_type=F32, precision=lax.Precision.HIGHEST)


def linear(x: jax.Array, w: jax.Array, bias: jax.Array | None = None, n_in: int = 1) -> jax.Array:
    """x (..., *I) times a weight w (*I, *O) over the last ``n_in`` axes of x, plus bias (*O) -> (..., *O) in
    x's dtype: ``einsum_f32``'s numerics, the bias added in fp32, rounded once (impl_torch's ``linear``).

    One 2-D product of the flattened operands: an einsum that keeps the head axes (``bsd,dhk->bhsk``,
    ``bthc,hcd->btd``) let XLA's layout assignment transpose the weight on every call (in a profile of the
    ``base`` fp32 forward, B=8, S=T=64: 54 copies of w_k, w_v and w_o, about 25 ms of 205); this reads it as stored.
    """
    lead, n = x.shape[:x.ndim - n_in], math.prod(w.shape[:n_in])
    y = einsum_f32("mi,io->mo", x.reshape(-1, n), w.reshape(n, -1))    # (rows, O) fp32
    if bias is not None:
        y = y + bias.reshape(-1)                                        # fp32
    return y.astype(x.dtype).reshape(*lead, *w.shape[n_in:])


# ----------------------------------------------------------------- layers

def positional_encoding(length: int, d_model: int) -> jax.Array:
    """Sinusoidal table (length, D) float32, interleaved sin/cos (section 3.5).

    ``PE[pos, 2i] = sin(pos / 10000^(2i/D))``, ``PE[pos, 2i+1] = cos(...)``.
    Computed once on the host in float64 and rounded to fp32: under ``jit`` it
    is a constant, and it is as close to exact as fp32 holds.
    """
    pos = np.arange(length, dtype=np.float64)[:, None]            # (L, 1)
    two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]   # (1, D/2)
    angle = pos / 10000.0 ** (two_i / d_model)                    # (L, D/2)
    pe = np.stack([np.sin(angle), np.cos(angle)], axis=-1)        # (L, D/2, 2)
    return jnp.asarray(pe.reshape(length, d_model), F32)          # (L, D)


def embedding(table: jax.Array, ids: jax.Array, config: Config, start: jax.Array | int = 0) -> jax.Array:
    """``E[ids] * sqrt(D) + PE[start:start+L]`` in fp32, rounded once to ``config.dtype`` (section 3.4).

    table (V, D), ids (B, L) int, already validated (JAX clamps out-of-range
    gathers silently). ``start`` may be traced (decoding). Returns (B, L, D).
    """
    L, D = ids.shape[1], config.d_model
    pe = lax.dynamic_slice_in_dim(positional_encoding(config.max_len, D), start, L)  # (L, D) fp32
    x = table[ids].astype(F32) * jnp.asarray(np.sqrt(D), F32)                      # (B, L, D) fp32
    return (x + pe).astype(config.dtype)


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    """Inverted dropout (section 5.4): each element kept with probability 1 - rate and scaled by 1 / (1 - rate)
    in fp32, rounded once to x's dtype. The identity when ``key`` is None (evaluation) or ``rate`` is 0."""
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)                       # x's shape, True = kept
    return jnp.where(keep, x.astype(F32) / (1.0 - rate), 0.0).astype(x.dtype)


def split(key: jax.Array | None, n: int) -> list[jax.Array | None]:
    """n independent dropout keys from ``key``; n Nones in evaluation (``key`` None)."""
    return [None] * n if key is None else list(jax.random.split(key, n))


def scaled_dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                                 implementation: str = "auto") -> jax.Array:
    """softmax(Q K^T / sqrt(d_k)) V (equation 1), scores and softmax in fp32, probabilities rounded.

    q (B, T, H, K), k (B, S, H, K), v (B, S, H, C) (the spec's layout), mask bool
    broadcastable to (B, H, T, S), True = may attend. Returns (B, T, H, C) in q's
    dtype. ``attend`` calls ``attention`` on heads-major keys and values instead.

    ``implementation``: "einsum" is the plain path below. "xla" is
    ``jax.nn.dot_product_attention``, whose XLA code (read in jax 0.4.31 and
    0.10.2) meets the contract: fp32 logits (``preferred_element_type``), scale
    in fp32, softmax in fp32, probabilities cast to the value dtype before P V.
    It masks with -0.7 * fp32 max instead of ``MASKED_SCORE``: masked keys still
    get exactly zero weight and fully masked (padding) query rows stay finite,
    which is all the contract asks. It needs d_v == d_k, and on the CPU (jax
    0.10.2) it fails to compile in bf16 when batch and heads are 1 and the query
    or key length is 1 ("ALG_DOT_BF16_BF16_F32 not supported by the
    ElementalIrEmitter"): a one-token decoding step of one sequence. "auto"
    (what the model uses) is therefore "einsum", which lowers to the same XLA
    operations. "cudnn" asks
    ``jax.nn.dot_product_attention`` for cuDNN's fused kernel on NVIDIA GPUs;
    it is not checked against the contract here.
    """
    if implementation in ("auto", "einsum"):
        return attention(q, k.swapaxes(1, 2), v.swapaxes(1, 2), mask)
    with jax.default_matmul_precision("highest"):  # fp32 mode: true fp32 products (no-op for bf16)
        return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=float(1.0 / np.sqrt(q.shape[-1])),
                                            implementation=implementation)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """The plain path of ``scaled_dot_product_attention``, one contract rule per line, over heads-major
    k (B, H, S, K) and v (B, H, S, C), the KV cache's layout (XLA's batched dot over (B, S, H, K) ran
    1.7-4x slower at decoding sizes): -> (B, T, H, C) in q's dtype, the activation dtype. k and v hold values
    of that dtype, stored in it or in fp32 (the KV cache on the CPU, ``impl_jax.model.cache_dtype``)."""
    scores = einsum_f32("bthk,bhsk->bhts", q, k)                     # (B, H, T, S) fp32, never rounded
    scores = scores * jnp.asarray(1.0 / np.sqrt(q.shape[-1]), F32)  # scaled after the product, in fp32
    scores = jnp.where(mask, scores, MASKED_SCORE)                   # masked keys: exactly zero weight
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)          # max-subtracted fp32 softmax, rounded
    # Heads-major out, transposed after: a (B, T, H, C) result made XLA run P V as a plain dot rather than YNNPACK
    # (18 such dots, ~6 ms of a 200 ms ``base`` forward).
    out = einsum_f32("bhts,bhsc->bhtc", probs, v)                    # (B, H, T, C) fp32
    return out.astype(q.dtype).transpose(0, 2, 1, 3)                 # (B, T, H, C)


def attention_kv(params: Params, x_kv: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Key and value projections, heads-major as the KV cache holds them: x_kv (B, S, D) -> k (B, H, S, K),
    v (B, H, S, C)."""
    k = linear(x_kv, params["w_k"])                                 # (B, S, H, K)
    v = linear(x_kv, params["w_v"])                                 # (B, S, H, C)
    return k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)         # (B, H, S, K), (B, H, S, C)


def attend(params: Params, x_q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Query projection, attention over heads-major k (B, H, S, K), v (B, H, S, C) computed earlier (the KV
    cache, cross-attention), output projection: (B, T, D) -> (B, T, D)."""
    q = linear(x_q, params["w_q"])                                     # (B, T, H, K)
    o = attention(q, k, v, mask)                                       # (B, T, H, C)
    return linear(o, params["w_o"], n_in=2)                            # (B, T, D)


def multi_head_attention(params: Params, x_q: jax.Array, x_kv: jax.Array, mask: jax.Array) -> jax.Array:
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O (section 3.2.2).

    params {w_q (D, H, K), w_k (D, H, K), w_v (D, H, C), w_o (H, C, D)};
    x_q (B, T, D), x_kv (B, S, D), mask bool broadcastable to (B, H, T, S).
    Returns (B, T, D).
    """
    return attend(params, x_q, *attention_kv(params, x_kv), mask)


def feed_forward(params: Params, x: jax.Array) -> jax.Array:
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (equation 2), each product rounded once after its bias.

    params {w_1 (D, F), b_1 (F,), w_2 (F, D), b_2 (D,)}; x (B, L, D) -> (B, L, D).
    """
    h = linear(x, params["w_1"], params["b_1"])                          # (B, L, F)
    h = jax.nn.relu(h)                                                   # exact in any dtype
    return linear(h, params["w_2"], params["b_2"])                       # (B, L, D)


def layer_norm(params: Params, x: jax.Array, eps: float) -> jax.Array:
    """LayerNorm over D (Ba et al., 2016): statistics and normalisation in fp32, result rounded to x's dtype.

    params {scale (D,), bias (D,)}; x (..., D) -> (..., D).
    """
    x32 = x.astype(F32)
    mu = x32.mean(axis=-1, keepdims=True)
    var = jnp.square(x32 - mu).mean(axis=-1, keepdims=True)
    y = (x32 - mu) / jnp.sqrt(var + eps) * params["scale"].astype(F32) + params["bias"].astype(F32)
    return y.astype(x.dtype)


def sublayer_connection(params: Params, name: str, x: jax.Array, sublayer: Callable[[jax.Array], jax.Array],
                        config: Config, key: jax.Array | None = None) -> jax.Array:
    """Residual connection around ``sublayer`` (section 5.4); the residual add is rounded to x's dtype.

    Post-LN (paper): ``LayerNorm(x + Dropout(Sublayer(x)))``; pre-LN (``config.norm_first``):
    ``x + Dropout(Sublayer(LayerNorm(x)))``; dropout only with a ``key`` (training). ``params`` is the layer's
    subtree, whose ``{name}_norm`` is the norm. Records ``name`` (the sublayer's output) and ``{name}.residual``.
    """
    norm = params[f"{name}_norm"]
    if config.norm_first:
        y = record(name, dropout(sublayer(layer_norm(norm, x, config.layer_norm_eps)), config.dropout, key))
        out = x + y
    else:
        y = record(name, dropout(sublayer(x), config.dropout, key))
        out = layer_norm(norm, x + y, config.layer_norm_eps)
    return record(f"{name}.residual", out)


def encoder_layer(params: Params, x: jax.Array, mask: jax.Array, config: Config, key: jax.Array | None = None
                  ) -> jax.Array:
    """Self-attention then FFN, each in a sublayer connection (section 3.1): (B, S, D) -> (B, S, D).

    mask: key padding mask broadcastable to (B, 1, 1, S); ``key``: dropout (training) or None.
    """
    keys = split(key, 2)
    x = sublayer_connection(params, "self_attn", x,
                            lambda h: multi_head_attention(params["self_attn"], h, h, mask), config, keys[0])
    return sublayer_connection(params, "ffn", x, lambda h: feed_forward(params["ffn"], h), config, keys[1])


def decoder_layer(params: Params, y: jax.Array, self_kv: tuple[jax.Array, jax.Array],
                  memory_kv: tuple[jax.Array, jax.Array], self_mask: jax.Array, memory_mask: jax.Array,
                  start: jax.Array | int, config: Config, key: jax.Array | None = None
                  ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """Masked self-attention with a KV cache, cross-attention, FFN (section 3.1).

    y (B, n, D): the new positions ``start .. start+n-1``. self_kv: this layer's
    preallocated cache, k (B, H, P, K) and v (B, H, P, C) for capacity P; the new
    keys/values are written at ``start`` (may be traced). memory_kv: the
    cross-attention keys/values of the encoder output, computed once per source
    (``attention_kv``). self_mask broadcastable to (B, 1, n, P) (causal and key
    padding); memory_mask to (B, 1, 1, S); ``key``: dropout (training) or None. Returns (y (B, n, D), updated
    self_kv).
    """
    cache, keys = {}, split(key, 3)

    def self_attn(h):
        k, v = attention_kv(params["self_attn"], h)                             # (B, H, n, K), (B, H, n, C)
        cache["kv"] = tuple(lax.dynamic_update_slice_in_dim(c, new.astype(c.dtype), start, axis=2)
                            for c, new in zip(self_kv, (k, v), strict=True))    # (B, H, P, K|C)
        return attend(params["self_attn"], h, *cache["kv"], self_mask)

    y = sublayer_connection(params, "self_attn", y, self_attn, config, keys[0])
    y = sublayer_connection(params, "cross_attn", y,
                            lambda h: attend(params["cross_attn"], h, *memory_kv, memory_mask), config, keys[1])
    y = sublayer_connection(params, "ffn", y, lambda h: feed_forward(params["ffn"], h), config, keys[2])
    return y, cache["kv"]
