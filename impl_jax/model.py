"""The encoder-decoder Transformer (Vaswani et al., 2017, section 3) as pure, jitted JAX functions.

Parameters are a pytree of nested dicts keyed by the canonical names of
``spec.schema`` (``params["decoder"]["layers"][1]["cross_attn"]["w_q"]`` is
``decoder.layers.1.cross_attn.w_q``; see ``impl_jax.weights``). The config is a
static argument: ``spec.config.Config`` is frozen and hashable, so each
(config, shapes) pair compiles once.

Every public function validates its inputs on host copies with ``spec.validate``
before anything is converted, traced or computed, so bad input raises the
spec's ``ValueError`` and never reaches JAX's clamping gathers.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from impl_jax import layers
from spec import validate
from spec.config import Config

Params = dict


class KVCache(NamedTuple):
    """Decoder state for incremental decoding, preallocated to a fixed capacity P (a pytree).

    self_kv: per decoder layer, self-attention k (B, P, H, K) and v (B, P, H, C);
        positions ``length ..`` are not written yet.
    key_mask: (B, P) bool, True where a key is written and is not padding.
    memory_kv: per decoder layer, cross-attention k (B, S, H, K) and v (B, S, H, C)
        of the encoder output, computed once per source.
    memory_mask: (B, S) bool, True where the source token is not padding.
    length: () int32, the number of positions written.
    """
    self_kv: tuple[tuple[jax.Array, jax.Array], ...]
    key_mask: jax.Array
    memory_kv: tuple[tuple[jax.Array, jax.Array], ...]
    memory_mask: jax.Array
    length: jax.Array

    @property
    def capacity(self) -> int:
        return self.key_mask.shape[1]


# ----------------------------------------------------------------- traceable stacks
# For use inside your own jax.jit (as generate.py does): inputs are assumed valid,
# parameters already in config.dtype (cast_params). The public functions below validate.

def cast_params(params: Params, config: Config) -> Params:
    """Parameters in the activation dtype (a no-op when ``param_dtype == dtype``)."""
    return jax.tree.map(lambda p: p.astype(config.dtype), params)


def _causal_mask(start: jax.Array | int, n: int, capacity: int) -> jax.Array:
    """(1, 1, n, P) bool: the query at position start+i may attend key j <= start+i."""
    q_pos = start + jnp.arange(n)[:, None]                 # (n, 1)
    return (jnp.arange(capacity)[None, :] <= q_pos)[None, None]


def encoder_stack(params: Params, src: jax.Array, config: Config, rec: layers.Record = None) -> jax.Array:
    """Encoder (section 3.1): src (B, S) int -> memory (B, S, D); key padding from ``pad_id``."""
    mask = (src != config.pad_id)[:, None, None, :]                               # (B, 1, 1, S) key padding
    x = layers.record(rec, "src_embed", layers.embedding(params["embedding"], src, config))  # (B, S, D)
    enc = params["encoder"]
    for i, p in enumerate(enc["layers"]):
        x = layers.encoder_layer(p, x, mask, config, rec, f"encoder.layers.{i}.")
        layers.record(rec, f"encoder.layers.{i}.out", x)
    if config.norm_first:
        x = layers.layer_norm(enc["final_norm"], x, config.layer_norm_eps)
    return layers.record(rec, "encoder.out", x)


def empty_cache(params: Params, memory: jax.Array, src: jax.Array, capacity: int, config: Config) -> KVCache:
    """A ``KVCache`` of static ``capacity`` with the cross-attention K/V of ``memory`` (B, S, D)."""
    B, H, dt = memory.shape[0], config.n_heads, memory.dtype
    empty = (jnp.zeros((B, capacity, H, config.d_k), dt), jnp.zeros((B, capacity, H, config.d_v), dt))
    memory_kv = tuple(layers.attention_kv(p["cross_attn"], memory) for p in params["decoder"]["layers"])
    return KVCache(tuple(empty for _ in memory_kv), jnp.zeros((B, capacity), bool), memory_kv,
                   src != config.pad_id, jnp.zeros((), jnp.int32))


def output_logits(params: Params, h: jax.Array) -> jax.Array:
    """Tied output projection h E^T (section 3.4): h (B, n, D) -> logits (B, n, V) float32, never rounded."""
    return layers.einsum_f32("bnd,vd->bnv", h, params["embedding"])


def decoder_stack(params: Params, tokens: jax.Array, cache: KVCache, config: Config, rec: layers.Record = None
                  ) -> tuple[jax.Array, KVCache]:
    """Decoder over tokens (B, n) at positions ``cache.length ..`` -> (logits (B, n, V) fp32, updated cache)."""
    start, n = cache.length, tokens.shape[1]
    key_mask = jax.lax.dynamic_update_slice_in_dim(cache.key_mask, tokens != config.pad_id, start, axis=1)
    self_mask = _causal_mask(start, n, cache.capacity) & key_mask[:, None, None, :]   # (B, 1, n, P)
    memory_mask = cache.memory_mask[:, None, None, :]                                # (B, 1, 1, S)
    y = layers.record(rec, "tgt_embed", layers.embedding(params["embedding"], tokens, config, start))
    dec, self_kv = params["decoder"], []
    for i, p in enumerate(dec["layers"]):
        y, kv = layers.decoder_layer(p, y, cache.self_kv[i], cache.memory_kv[i], self_mask, memory_mask, start,
                                     config, rec, f"decoder.layers.{i}.")
        self_kv.append(kv)
        layers.record(rec, f"decoder.layers.{i}.out", y)
    if config.norm_first:
        y = layers.layer_norm(dec["final_norm"], y, config.layer_norm_eps)
    logits = layers.record(rec, "logits", output_logits(params, layers.record(rec, "decoder.out", y)))
    return logits, KVCache(tuple(self_kv), key_mask, cache.memory_kv, cache.memory_mask, start + n)


@functools.partial(jax.jit, static_argnames=("config", "intermediates"))
def _forward(params: Params, src: jax.Array, tgt_in: jax.Array, config: Config, intermediates: bool):
    params, rec = cast_params(params, config), {} if intermediates else None
    memory = encoder_stack(params, src, config, rec)
    cache = empty_cache(params, memory, src, tgt_in.shape[1], config)  # capacity T: one code path with decode
    logits, _ = decoder_stack(params, tgt_in, cache, config, rec)
    return logits, rec or {}


@functools.partial(jax.jit, static_argnames=("config",))
def _encode_jit(params: Params, src: jax.Array, config: Config) -> jax.Array:
    return encoder_stack(cast_params(params, config), src, config)


@functools.partial(jax.jit, static_argnames=("config", "capacity"))
def _init_cache_jit(params: Params, memory: jax.Array, src: jax.Array, config: Config, capacity: int) -> KVCache:
    return empty_cache(cast_params(params, config), memory, src, capacity, config)


@functools.partial(jax.jit, static_argnames=("config",))
def _decode_jit(params: Params, tokens: jax.Array, cache: KVCache, config: Config) -> tuple[jax.Array, KVCache]:
    return decoder_stack(cast_params(params, config), tokens, cache, config)


# ----------------------------------------------------------------- public API

def encode(params: Params, config: Config, src) -> jax.Array:
    """Encoder stack: src (B, S) int token ids -> memory (B, S, D) in ``config.dtype``.

    Raises:
        ValueError: from ``spec.validate.check_source``.
    """
    src = np.asarray(src)
    validate.check_source(src, config)
    return _encode_jit(params, jnp.asarray(src, jnp.int32), config)


def init_cache(params: Params, config: Config, memory: jax.Array, src, capacity: int) -> KVCache:
    """An empty ``KVCache`` for ``memory`` (B, S, D) of ``src`` (B, S), holding up to ``capacity`` positions.

    Raises:
        ValueError: from ``spec.validate.check_source``, or if ``capacity`` is not
            an int in [1, config.max_len] (``check_capacity``) or ``memory`` does not match ``src``.
    """
    src = np.asarray(src)
    validate.check_source(src, config)
    validate.check_capacity(capacity, config)
    if tuple(memory.shape) != (*src.shape, config.d_model):
        raise ValueError(f"memory shape {tuple(memory.shape)} does not match src {src.shape} and d_model")
    return _init_cache_jit(params, memory, jnp.asarray(src, jnp.int32), config, int(capacity))


def decode(params: Params, config: Config, tokens, cache: KVCache) -> tuple[jax.Array, KVCache]:
    """Decoder stack over n new tokens at positions ``cache.length ..`` (section 3.1).

    tokens (B, n) int -> (logits (B, n, V) float32, the updated cache). The
    self-attention sees the cached positions and the new ones causally, minus
    padding keys; cross-attention uses the cache's precomputed K/V.

    Raises:
        ValueError: from ``spec.validate.check_decode``: bad ids, a batch that differs
            from the cache's, or tokens that do not fit in the cache's capacity.
    """
    tokens = np.asarray(tokens)
    validate.check_decode(tokens, config, cache.key_mask.shape[0], int(cache.length), cache.capacity)
    return _decode_jit(params, jnp.asarray(tokens, jnp.int32), cache, config)


def forward(params: Params, config: Config, src, tgt_in, intermediates: bool = False):
    """Teacher-forced forward: src (B, S), tgt_in (B, T) int -> logits (B, T, V) float32.

    With ``intermediates=True`` returns ``(logits, {name: tensor})`` with the
    tensors of ``spec.shapes.intermediates`` (activations in ``config.dtype``).
    Padding keys are masked in every attention; the decoder's self-attention is
    causal (section 3.2.3).

    Raises:
        ValueError: from ``spec.validate.check_forward``.
    """
    src, tgt_in = np.asarray(src), np.asarray(tgt_in)
    validate.check_forward(src, tgt_in, config)
    logits, rec = _forward(params, jnp.asarray(src, jnp.int32), jnp.asarray(tgt_in, jnp.int32), config,
                           bool(intermediates))
    return (logits, rec) if intermediates else logits
