"""The Transformer's building blocks (Vaswani et al., 2017) as JAX modules: frozen dataclasses registered as
pytrees; the encoder and decoder layers made of them are ``impl_jax.stacks``'.

A layer's parameters are its data fields (leaves, or submodules), its configuration its static fields (aux data),
so a layer passes through ``jax.jit``, ``jax.grad`` and ``jax.tree.map`` like any pytree. Each is built from the
canonical ``{name: array}`` of ``spec.schema`` and the layer's name in it (``"decoder.layers.1.cross_attn"``), and
its key paths are those names. Numerics follow ``spec.numerics`` through ``impl_jax.numerics``.

Layers ``record`` named intermediates (``spec.shapes.intermediates``, ``spec.recording``); they are kept only inside
a ``recording`` block, by the name joined to the enclosing ``scope``s. Under ``jit`` this happens at trace time.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
import zlib

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from impl_jax import numerics
from spec.config import Config
from spec.numerics import MASKED_SCORE
from spec.recording import record, scoped

F32 = jnp.float32
KV = tuple[jax.Array, jax.Array]
_evaluation_copies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> ``without_dropout(module)``


class Module:
    """Base of every layer and of the model, in the Equinox style: a subclass is a frozen dataclass whose fields
    are set once by its ``__init__`` (``vars(self).update``) and a pytree whose children are its data fields and
    whose aux data are its ``static`` fields (``dataclasses.field(metadata={"static": True})``). Unflattening
    rebuilds a module from its fields without calling ``__init__``; calling a module calls its ``forward``."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(init=False, repr=False, eq=False, frozen=True)(cls)
        fields = dataclasses.fields(cls)
        data = [f.name for f in fields if not f.metadata.get("static")]
        meta = [f.name for f in fields if f.metadata.get("static")]

        def unflatten(aux: tuple, children: list) -> Module:
            module = object.__new__(cls)
            vars(module).update(zip(meta, aux, strict=True), **dict(zip(data, children, strict=True)))
            return module

        jax.tree_util.register_pytree_with_keys(
            cls, lambda m: ([(jax.tree_util.GetAttrKey(n), getattr(m, n)) for n in data],
                            tuple(getattr(m, n) for n in meta)),
            unflatten, lambda m: ([getattr(m, n) for n in data], tuple(getattr(m, n) for n in meta)))

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


def without_dropout(module: Module) -> Module:
    """``module`` (a model, or a layer holding a config) with ``config.dropout`` 0.0 in its config and every
    submodule's, the same leaves (no copies): what evaluation, which never draws dropout (section 5.4), compiles for,
    so its programs are shared by models that differ in dropout alone. The module itself at dropout 0; else a copy
    kept while ``module`` (frozen) lives."""
    if module.config.dropout == 0.0:
        return module
    if module in _evaluation_copies:
        return _evaluation_copies[module]
    config = module.config.replace(dropout=0.0)

    def copy(x: object) -> object:  # x with ``config``, copied with the submodules that hold a config
        if type(x) is tuple:        # a stack's layers
            return tuple(copy(m) for m in x)
        if not isinstance(x, Module) or "config" not in vars(x):
            return x
        new = object.__new__(type(x))
        vars(new).update({k: copy(v) for k, v in vars(x).items()}, config=config)
        return new

    return _evaluation_copies.setdefault(module, copy(module))


def dropout(x: jax.Array, site: str, rate: float, rng: jax.Array | None) -> jax.Array:
    """Inverted dropout at a dropout site (section 5.4, ``spec.shapes.dropout_sites``): x (B, L, D) -> (B, L, D),
    each element kept with probability 1 - rate and divided by 1 - rate in fp32 (the divisor rounded to fp32), the
    quotient rounded once to x's dtype; the identity without ``rng`` (evaluation) or at rate 0. Records the result
    as ``site`` and, with dropout, the keep mask (x's shape, bool, True = kept) as ``<site>.keep``.

    ``rng``: a PRNG key, the forward's one key. Each site draws from its own key, ``rng`` folded with the crc32 of
    its scoped name (as ``impl_tf.layers.dropout`` folds it into its seed, and Flax a module's name into its key),
    so every site of a forward draws apart from the others without keys split and threaded through the layers,
    and the same key draws the same masks.
    """
    if rng is None or rate == 0.0:
        return record(site, x)
    site_rng = jax.random.fold_in(rng, zlib.crc32(scoped(site).encode()))
    keep = record(f"{site}.keep", jax.random.bernoulli(site_rng, 1.0 - rate, x.shape))
    # XLA rewrites a division by a broadcast scalar as a product with its reciprocal, which misses the rounded
    # quotient for about a quarter of the elements: a divisor of x's shape keeps the division.
    divisor = jnp.where(keep, jnp.asarray(1.0 - rate, F32), 1.0)
    return record(site, jnp.where(keep, x.astype(F32) / divisor, 0.0).astype(x.dtype))


def positional_encoding(length: int, d_model: int, halves: bool = False) -> jax.Array:
    """Sinusoidal table (L, D) float32, interleaved sin/cos (section 3.5): ``PE[pos, 2i] = sin(pos /
    10000^(2i/D))``, ``PE[pos, 2i+1] = cos(...)``; with ``halves`` (``config.positions="sinusoidal_halves"``) the
    D/2 sines first and the D/2 cosines after. Computed on the host in float64 and rounded to fp32 (a constant
    under ``jit``, as close to exact as fp32 holds)."""
    pos = np.arange(length, dtype=np.float64)[:, None]            # (L, 1)
    two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]   # (1, D/2)
    angle = pos / 10000.0 ** (two_i / d_model)                    # (L, D/2)
    pe = np.stack([np.sin(angle), np.cos(angle)], axis=-2 if halves else -1)  # (L, 2, D/2) or (L, D/2, 2)
    return jnp.asarray(pe.reshape(length, d_model), F32)          # (L, D)


class Embedder(Module):
    """The token embedding E (V, D), shared by both stacks and the output projection (section 3.4); the learned
    positions (``config.positions="learned"``) and the logits' bias (``config.logits_bias``), else None."""

    table: jax.Array                                              # (V, D)
    positions: jax.Array | None                                   # (max_len, D)
    bias: jax.Array | None                                        # (V,)
    config: Config = dataclasses.field(metadata={"static": True})

    def __init__(self, config: Config, params: dict[str, jax.Array]):
        vars(self).update(table=params["embedding"], positions=params.get("position_embedding"),
                          bias=params.get("logits_bias"), config=config)

    def encode(self, ids: jax.Array, start: jax.Array | int = 0) -> jax.Array:
        """``E[ids] * sqrt(D) + PE[start:start+L]`` in fp32 (times 1 without ``config.scale_embedding``; PE the
        sinusoidal table in ``config.positions``' layout or the learned rows), rounded once to ``config.dtype``:
        ids (B, L) int, already validated (JAX clamps out-of-range gathers silently), ``start`` may be traced ->
        (B, L, D)."""
        c = self.config
        if self.positions is None:
            table = positional_encoding(c.max_len, c.d_model, c.positions == "sinusoidal_halves")
        else:
            table = self.positions.astype(F32)
        pe = lax.dynamic_slice_in_dim(table, start, ids.shape[1])                                      # (L, D)
        x = self.table[ids].astype(F32)                                                                # (B, L, D)
        if c.scale_embedding:
            x = x * jnp.asarray(np.sqrt(c.d_model), F32)
        return (x + pe).astype(c.dtype)

    def decode(self, x: jax.Array) -> jax.Array:
        """The tied output projection x E^T (plus the logits' bias): (B, L, D) -> logits (B, L, V) float32."""
        return numerics.logits(x, self.table, self.bias)


def scaled_dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """softmax(Q K^T / sqrt(d_k)) V (equation 1), one contract rule per line: q (B, T, H, K), heads-major k
    (B, H, S, K) and v (B, H, S, C) (the KV cache's layout), mask bool broadcastable to (B, H, T, S), True = may
    attend -> (B, T, H, C) in q's dtype. k and v hold values of that dtype, stored in it or in fp32."""
    scores = numerics.matmul_f32("bthk,bhsk->bhts", q, k)            # (B, H, T, S) fp32, never rounded
    scores = scores * jnp.asarray(1.0 / np.sqrt(q.shape[-1]), F32)  # scaled after the product, in fp32
    scores = jnp.where(mask, scores, MASKED_SCORE)                   # masked keys: exactly zero weight
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)          # max-subtracted fp32 softmax, rounded
    out = numerics.matmul_f32("bhts,bhsc->bhtc", probs, v)           # (B, H, T, C) fp32: heads-major out
    return out.astype(q.dtype).transpose(0, 2, 1, 3)                 # (B, T, H, C)


class MultiHeadAttention(Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O (section 3.2.2); with ``config.attention_bias`` each
    projection adds its bias (``b_q``.. ``b_o``, else None) before its rounding."""

    w_q: jax.Array                                                    # (D, H, K)
    b_q: jax.Array | None                                             # (H, K)
    w_k: jax.Array                                                    # (D, H, K)
    b_k: jax.Array | None                                             # (H, K)
    w_v: jax.Array                                                    # (D, H, C)
    b_v: jax.Array | None                                             # (H, C)
    w_o: jax.Array                                                    # (H, C, D)
    b_o: jax.Array | None                                             # (D,)

    def __init__(self, config: Config, params: dict[str, jax.Array], name: str):
        vars(self).update({w: params[f"{name}.{w}"] for w in ("w_q", "w_k", "w_v", "w_o")})
        vars(self).update({b: params[f"{name}.{b}"] if config.attention_bias else None
                           for b in ("b_q", "b_k", "b_v", "b_o")})

    def project_kv(self, x: jax.Array) -> KV:
        """Keys and values of x (B, M, D), heads-major as the KV cache holds them: k (B, H, M, K), v (B, H, M, C)."""
        k = numerics.linear(x, self.w_k, self.b_k)                    # (B, M, H, K)
        v = numerics.linear(x, self.w_v, self.b_v)                    # (B, M, H, C)
        return k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)

    def forward(self, x: jax.Array, kv: KV, mask: jax.Array) -> jax.Array:
        """Queries of x (B, L, D) attend over the projected ``kv`` (``project_kv``: this input's, the cache's or
        the encoder output's) under mask (B|1, 1, L|1, M) -> (B, L, D)."""
        q = numerics.linear(x, self.w_q, self.b_q)                    # (B, L, H, K)
        o = scaled_dot_product_attention(q, *kv, mask)                # (B, L, H, C)
        return numerics.linear(o, self.w_o, self.b_o, n_in=2)        # (B, L, D)


def activation(h: jax.Array, name: str) -> jax.Array:
    """The FFN's nonlinearity ``config.activation`` (``spec.config.ACTIVATIONS``) of the rounded hidden units h
    (B, L, F): computed in fp32 and rounded once to h's dtype; ReLU, exact in any dtype, on h as it is."""
    if name == "relu":
        return jax.nn.relu(h)
    return _ACTIVATIONS[name](h.astype(F32)).astype(h.dtype)


def _gelu_tanh(x: jax.Array) -> jax.Array:
    """GELU's tanh approximation as x sigmoid(2z), z = sqrt(2/pi) (x + 0.044715 x^3): 0.5 (1 + tanh(z)) without
    the cancellation of 1 + tanh(z) for negative x (``jax.nn.gelu``'s), which lost fp32 bits a bf16 rounding saw."""
    return x * jax.nn.sigmoid(jnp.asarray(2 * np.sqrt(2 / np.pi), F32) * (x + jnp.asarray(0.044715, F32) * x ** 3))


# The FFN's activations but ReLU, on fp32 values. jax.nn.gelu's exact form is 0.5 x erfc(-x / sqrt(2)): accurate.
_ACTIVATIONS = {"gelu": functools.partial(jax.nn.gelu, approximate=False), "gelu_tanh": _gelu_tanh,
                "silu": jax.nn.silu}


class FeedForward(Module):
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2 (equation 2; act ``config.activation``, the paper's ReLU by default),
    each product rounded once after its bias."""

    w_1: jax.Array                                                    # (D, F)
    b_1: jax.Array                                                    # (F,)
    w_2: jax.Array                                                    # (F, D)
    b_2: jax.Array                                                    # (D,)
    act: str = dataclasses.field(metadata={"static": True})

    def __init__(self, config: Config, params: dict[str, jax.Array], name: str):
        vars(self).update({w: params[f"{name}.{w}"] for w in ("w_1", "b_1", "w_2", "b_2")}, act=config.activation)

    def forward(self, x: jax.Array) -> jax.Array:
        """x (B, L, D) -> (B, L, D); the hidden layer (B, L, F)."""
        h = activation(numerics.linear(x, self.w_1, self.b_1), self.act)
        return numerics.linear(h, self.w_2, self.b_2)


class LayerNorm(Module):
    """LayerNorm over D (Ba et al., 2016): statistics and normalisation in fp32, the result rounded to x's dtype."""

    scale: jax.Array                                                  # (D,)
    bias: jax.Array                                                   # (D,)
    eps: float = dataclasses.field(metadata={"static": True})

    def __init__(self, config: Config, params: dict[str, jax.Array], name: str):
        vars(self).update(scale=params[f"{name}.scale"], bias=params[f"{name}.bias"], eps=config.layer_norm_eps)

    def forward(self, x: jax.Array) -> jax.Array:
        """x (..., D) -> (..., D)."""
        x32 = x.astype(F32)
        mu = x32.mean(axis=-1, keepdims=True)
        var = jnp.square(x32 - mu).mean(axis=-1, keepdims=True)
        y = (x32 - mu) / jnp.sqrt(var + self.eps) * self.scale.astype(F32) + self.bias.astype(F32)
        return y.astype(x.dtype)
