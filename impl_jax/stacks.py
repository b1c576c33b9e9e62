"""The encoder and decoder stacks (section 3.1): the encoder and decoder layers, the stacks of N of them, the KV cache
their decoder runs on, and the model's computations on validated, bucketed device ids (no checks: the callers in
``impl_jax.model``, ``lm``, ``search`` and ``sampling`` validate first).

The layers and stacks are ``layers.Module``s (pytrees: parameters as children, the config static aux data); the
computations are traced inside their callers' jitted programs, on the model's weights as those pass them.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from impl_jax.layers import KV, FeedForward, LayerNorm, Module, MultiHeadAttention, dropout
from spec.config import Config
from spec.recording import record, scope


class KVCache(NamedTuple):
    """Decoder state for incremental decoding, preallocated to a fixed capacity P (a pytree; ``spec.api``).

    self_kv: per decoder layer, self-attention k (B, H, P, K) and v (B, H, P, C), written up to ``length``;
    key_mask (B, P) bool, True where a key is written and is not padding; memory_kv: per decoder layer,
    cross-attention k (B, H, S, K) and v (B, H, S, C) of the encoder output; memory_mask (B, S) bool, True at a
    non-pad source token (a decoder-only model's cache: memory_kv ``()``, memory_mask None); length () int32, the
    positions written.
    """
    self_kv: tuple[KV, ...]
    key_mask: jax.Array
    memory_kv: tuple[KV, ...]
    memory_mask: jax.Array | None
    length: jax.Array


def key_padding_mask(ids: jax.Array, pad_id: int) -> jax.Array:
    """(B, L) bool, True at a non-pad token."""
    return ids != pad_id


def causal_mask(start: jax.Array | int, n: int, capacity: int) -> jax.Array:
    """(n, capacity) bool: the query at position start + i may attend keys 0..start + i (section 3.2.3)."""
    q_pos = start + jnp.arange(n)[:, None]                 # (n, 1)
    return jnp.arange(capacity)[None, :] <= q_pos


class EncoderLayer(Module):
    """Self-attention then FFN, each in a residual connection with LayerNorm (section 3.1): post-LN as the paper,
    or pre-LN (``config.norm_first``); each residual sum rounded to the activation dtype."""

    config: Config = dataclasses.field(metadata={"static": True})
    self_attn: MultiHeadAttention
    self_attn_norm: LayerNorm
    ffn: FeedForward
    ffn_norm: LayerNorm

    def __init__(self, config: Config, params: dict[str, jax.Array], name: str):
        vars(self).update(_sublayers(config, params, name, ("self_attn",)))

    def forward(self, x: jax.Array, mask: jax.Array, rng: jax.Array | None = None) -> jax.Array:
        """x (B, S, D), key padding mask (B, 1, 1, S); dropout (section 5.4) from ``rng`` -> (B, S, D)."""
        pre, rate = self.config.norm_first, self.config.dropout
        h = self.self_attn_norm(x) if pre else x
        x = x + dropout(self.self_attn(h, self.self_attn.project_kv(h), mask), "self_attn", rate, rng)
        x = record("self_attn.residual", x if pre else self.self_attn_norm(x))
        h = self.ffn(self.ffn_norm(x) if pre else x)
        x = x + dropout(h, "ffn", rate, rng)
        return record("ffn.residual", x if pre else self.ffn_norm(x))


class DecoderLayer(Module):
    """Masked self-attention over a KV cache, cross-attention over the encoder output, FFN (section 3.1), each in
    a residual connection as ``EncoderLayer``'s. A decoder-only model's layer (``config.decoder_only``) has no
    cross-attention: ``cross_attn`` and ``cross_attn_norm`` are None (empty subtrees)."""

    config: Config = dataclasses.field(metadata={"static": True})
    self_attn: MultiHeadAttention
    self_attn_norm: LayerNorm
    cross_attn: MultiHeadAttention | None
    cross_attn_norm: LayerNorm | None
    ffn: FeedForward
    ffn_norm: LayerNorm

    def __init__(self, config: Config, params: dict[str, jax.Array], name: str):
        attentions = ("self_attn",) if config.decoder_only else ("self_attn", "cross_attn")
        vars(self).update({"cross_attn": None, "cross_attn_norm": None} | _sublayers(config, params, name, attentions))

    def forward(self, y: jax.Array, self_kv: KV, self_mask: jax.Array, memory_kv: KV | None,
                memory_mask: jax.Array | None, start: jax.Array | int, rng: jax.Array | None = None
                ) -> tuple[jax.Array, KV]:
        """y (B, n, D): the new positions ``start ..`` (may be traced); self_kv: this layer's cache, k (B, H, P, K)
        and v (B, H, P, C); self_mask (B, 1, n, P) causal and key padding; memory_kv: the encoder output's
        projected k (B, H, S, K), v (B, H, S, C); memory_mask (B, 1, 1, S), both None in a decoder-only model;
        dropout from ``rng``. The new keys and values are written at ``start`` -> (y (B, n, D), the updated
        self_kv)."""
        pre, rate = self.config.norm_first, self.config.dropout
        h = self.self_attn_norm(y) if pre else y
        self_kv = tuple(lax.dynamic_update_slice_in_dim(cached, new.astype(cached.dtype), start, axis=2)
                        for cached, new in zip(self_kv, self.self_attn.project_kv(h), strict=True))  # (B, H, P, .)
        y = y + dropout(self.self_attn(h, self_kv, self_mask), "self_attn", rate, rng)
        y = record("self_attn.residual", y if pre else self.self_attn_norm(y))
        if self.cross_attn is not None:
            h = self.cross_attn(self.cross_attn_norm(y) if pre else y, memory_kv, memory_mask)
            y = y + dropout(h, "cross_attn", rate, rng)
            y = record("cross_attn.residual", y if pre else self.cross_attn_norm(y))
        h = self.ffn(self.ffn_norm(y) if pre else y)
        y = y + dropout(h, "ffn", rate, rng)
        return record("ffn.residual", y if pre else self.ffn_norm(y)), self_kv


def _sublayers(config: Config, params: dict[str, jax.Array], name: str, attentions: tuple[str, ...]) -> dict:
    """The fields of the layer ``name`` (section 3.1): ``config``, each of its ``attentions`` and its LayerNorm, then
    the FFN and its LayerNorm."""
    fields = {"config": config}
    for a in attentions:
        fields[a] = MultiHeadAttention(config, params, f"{name}.{a}")
        fields[f"{a}_norm"] = LayerNorm(config, params, f"{name}.{a}_norm")
    return fields | {"ffn": FeedForward(config, params, f"{name}.ffn"),
                     "ffn_norm": LayerNorm(config, params, f"{name}.ffn_norm")}


class Stack(Module):
    """``n`` layers of one kind under the canonical prefix ``name``, then a final LayerNorm when pre-LN (section
    3.1): what the encoder and decoder stacks share."""

    layers: tuple[Module, ...]
    final_norm: LayerNorm | None
    config: Config = dataclasses.field(metadata={"static": True})

    def __init__(self, config: Config, params: dict[str, jax.Array], layer: type[Module], name: str, n: int):
        vars(self).update(
            layers=tuple(layer(config, params, f"{name}.layers.{i}") for i in range(n)),
            final_norm=LayerNorm(config, params, f"{name}.final_norm") if config.norm_first else None,
            config=config)


class Encoder(Stack):
    """The encoder stack (section 3.1): N ``EncoderLayer``s, then a final LayerNorm when pre-LN."""

    def __init__(self, config: Config, params: dict[str, jax.Array]):
        super().__init__(config, params, EncoderLayer, "encoder", config.n_encoder_layers)

    def forward(self, x: jax.Array, mask: jax.Array, rng: jax.Array | None = None) -> jax.Array:
        """x (B, S, D): the source embeddings (section 3.4, after their dropout); mask (B, 1, 1, S) key padding;
        the sublayers' dropout (section 5.4) from ``rng`` -> memory (B, S, D)."""
        for i, layer in enumerate(self.layers):
            with scope(f"encoder.layers.{i}"):
                x = record("out", layer(x, mask, rng))
        if self.final_norm is not None:
            x = self.final_norm(x)
        return record("encoder.out", x)


class Decoder(Stack):
    """The decoder stack (section 3.1): N ``DecoderLayer``s over a KV cache, then a final LayerNorm when pre-LN."""

    def __init__(self, config: Config, params: dict[str, jax.Array]):
        super().__init__(config, params, DecoderLayer, "decoder", config.n_decoder_layers)

    def forward(self, y: jax.Array, cache: KVCache, rng: jax.Array | None = None) -> tuple[jax.Array, KVCache]:
        """y (B, n, D): the target embeddings of positions ``cache.length ..`` (after their dropout), which
        ``cache.key_mask`` already covers; the sublayers' dropout from ``rng`` -> (h (B, n, D), the updated cache)."""
        start, n, capacity = cache.length, y.shape[1], cache.key_mask.shape[1]
        self_mask = causal_mask(start, n, capacity)[None, None] & cache.key_mask[:, None, None, :]  # (B, 1, n, P)
        memory_mask = None if cache.memory_mask is None else cache.memory_mask[:, None, None, :]  # (B, 1, 1, S)
        self_kv = []
        for i, layer in enumerate(self.layers):
            with scope(f"decoder.layers.{i}"):
                memory_kv = cache.memory_kv[i] if cache.memory_kv else None                      # decoder-only: none
                y, kv = layer(y, cache.self_kv[i], self_mask, memory_kv, memory_mask, start, rng)
                record("out", y)
            self_kv.append(kv)
        if self.final_norm is not None:
            y = self.final_norm(y)
        return record("decoder.out", y), cache._replace(self_kv=tuple(self_kv), length=start + n)


def encoder_memory(model: Module, src: jax.Array, rng: jax.Array | None = None) -> jax.Array:
    """The encoder of a ``Transformer``, traced, on its weights as they are: src (B, S) -> memory (B, S, D)
    (section 3.1); dropout from ``rng``."""
    mask = key_padding_mask(src, model.config.pad_id)[:, None, None, :]                    # (B, 1, 1, S)
    x = dropout(model.embedder.encode(src), "src_embed", model.config.dropout, rng)     # (B, S, D)
    return model.encoder(x, mask, rng)


def empty_cache(model: Module, batch: int, capacity: int) -> KVCache:
    """An empty ``KVCache`` of static ``batch`` and ``capacity`` without cross-attention K/V (a decoder-only
    model's). On the CPU a bf16 cache holds its keys and values in fp32 (the same values): XLA's CPU backend has no
    bf16 x bf16 -> fp32 batched dot and would convert the cache at every step."""
    c = model.config
    dt = jnp.float32 if c.dtype == "bfloat16" and jax.default_backend() == "cpu" else jnp.dtype(c.dtype)
    empty = (jnp.zeros((batch, c.n_heads, capacity, c.d_k), dt), jnp.zeros((batch, c.n_heads, capacity, c.d_v), dt))
    return KVCache(tuple(empty for _ in range(c.n_decoder_layers)), jnp.zeros((batch, capacity), bool), (), None,
                   jnp.zeros((), jnp.int32))


def source_cache(model: Module, memory: jax.Array, src: jax.Array, capacity: int) -> KVCache:
    """A ``Transformer``'s cache for ``memory`` (B, S, D) of src (B, S), traced, on its weights as they are:
    ``empty_cache`` of static ``capacity`` with the cross-attention K/V of ``memory``, in the cache's dtype."""
    cache = empty_cache(model, memory.shape[0], capacity)
    memory_kv = tuple(tuple(t.astype(cache.self_kv[0][0].dtype) for t in layer.cross_attn.project_kv(memory))
                      for layer in model.decoder.layers)
    return cache._replace(memory_kv=memory_kv, memory_mask=key_padding_mask(src, model.config.pad_id))


def decoder_logits(model: Module, tokens: jax.Array, cache: KVCache, rng: jax.Array | None = None, *,
                   at: jax.Array | None = None) -> tuple[jax.Array, KVCache]:
    """Traced, on either model's weights as they are: tokens (B, n) at positions ``cache.length ..`` -> (logits
    (B, n, V) float32, or (B, 1, V) of new position ``at`` alone, the updated cache); dropout from ``rng``."""
    c, start = model.config, cache.length
    key_mask = lax.dynamic_update_slice_in_dim(cache.key_mask, key_padding_mask(tokens, c.pad_id), start, axis=1)
    y = dropout(model.embedder.encode(tokens, start), "tgt_embed", c.dropout, rng)  # (B, n, D)
    h, cache = model.decoder(y, cache._replace(key_mask=key_mask), rng)
    h = h if at is None else lax.dynamic_slice_in_dim(h, at, 1, axis=1)  # a prefill needs its last position only
    return record("logits", model.embedder.decode(h)), cache
