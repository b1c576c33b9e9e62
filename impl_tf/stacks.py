"""The encoder and decoder stacks (Vaswani et al., 2017, section 3.1): the encoder and decoder layers, the stacks of
N of them, the KV cache their decoder runs on, and the model's computations on validated, bucketed device ids.

The decoder has one code path, as in ``spec.reference``: it consumes n new target tokens against a ``KVCache`` of
everything before them; a teacher-forced forward is one call with all T tokens and an empty cache. The functions
here (``encoder_memory``, ``empty_cache``, ``source_cache``, ``decoder_logits``, ``forward_logits``) check nothing:
their callers in ``impl_tf.model``, ``lm``, ``search``, ``sampling`` and ``train`` validate first, and run them
traced, inside the programs of ``impl_tf.programs``.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import tensorflow as tf

from impl_tf.layers import FeedForward, LayerNorm, MultiHeadAttention, dropout, residual_add, write_kv
from spec.annotations import Bool, Float, Int
from spec.config import Config
from spec.recording import record, scope

if TYPE_CHECKING:  # annotations only: impl_tf.model imports this module
    from impl_tf.model import Transformer


class KVCache(NamedTuple):
    """Decoder state for incremental decoding (``spec.api.KV_CACHE_FIELDS``); fixed-shape, so it can live in a
    compiled ``tf.while_loop``; a nest of tensors. Self-attention keys/values are preallocated to a capacity P and
    written in place by ``decode``; cross-attention keys/values are computed once per source
    (``Transformer.init_cache``); a decoder-only model's ``memory_kv`` is () and ``memory_mask`` None."""

    self_kv: tuple[tuple[Float[tf.Tensor, "B H P K"], Float[tf.Tensor, "B H P C"]], ...]  # per decoder layer
    key_mask: Bool[tf.Tensor, "B P"]  # True = a written, non-pad target position
    memory_kv: tuple[tuple[Float[tf.Tensor, "B H S K"], Float[tf.Tensor, "B H S C"]], ...]  # per decoder layer
    memory_mask: Bool[tf.Tensor, "B S"] | None  # True = non-pad source position
    length: Int[tf.Tensor, ""]  # int32: positions written so far


def key_padding_mask(ids: tf.Tensor, pad_id: int) -> tf.Tensor:
    """ids (B, L) -> (B, L) bool, True at non-pad positions."""
    return ids != pad_id


def causal_mask(start: tf.Tensor, n: tf.Tensor, capacity: tf.Tensor) -> tf.Tensor:
    """(n, capacity) bool: the query at position start + i may attend keys 0..start + i (section 3.2.3)."""
    return tf.range(capacity)[None, :] <= (start + tf.range(n))[:, None]


class EncoderLayer(tf.Module):
    """Self-attention then FFN, each with a residual connection, dropout and LayerNorm (sections 3.1, 5.4): post-LN
    (paper) ``LayerNorm(x + Dropout(Sublayer(x)))``, pre-LN (``config.norm_first``) ``x + Dropout(Sublayer(
    LayerNorm(x)))``. Records each sublayer's output after dropout as ``<sublayer>`` (with dropout, its keep mask as
    ``<sublayer>.keep``) and the residual line's as ``<sublayer>.residual``, under its caller's ``scope``."""

    def __init__(self, config: Config, params: dict[str, np.ndarray], name: str):
        super().__init__(name="encoder_layer")
        self.norm_first, self.rate = config.norm_first, config.dropout
        attention, norm = (functools.partial(m, config, params) for m in (MultiHeadAttention, LayerNorm))
        self.self_attn, self.self_attn_norm = attention(f"{name}.self_attn"), norm(f"{name}.self_attn_norm")
        self.ffn, self.ffn_norm = FeedForward(config, params, f"{name}.ffn"), norm(f"{name}.ffn_norm")

    def forward(self, x: tf.Tensor, mask: tf.Tensor, rng: tf.Tensor | None = None) -> tf.Tensor:
        """x (B, S, D), key padding mask (B, 1, 1, S) -> (B, S, D); ``rng`` as ``layers.dropout``'s."""
        pre = self.norm_first
        h = self.self_attn_norm.forward(x) if pre else x
        h = self.self_attn.forward(h, self.self_attn.project_kv(h), mask)
        x = residual_add(x, dropout(h, "self_attn", self.rate, rng))
        x = record("self_attn.residual", x if pre else self.self_attn_norm.forward(x))
        h = self.ffn.forward(self.ffn_norm.forward(x) if pre else x)
        x = residual_add(x, dropout(h, "ffn", self.rate, rng))
        return record("ffn.residual", x if pre else self.ffn_norm.forward(x))


class DecoderLayer(tf.Module):
    """Masked self-attention over a KV cache, cross-attention, FFN (section 3.1), each as ``EncoderLayer``'s; a
    decoder-only model's (``config.decoder_only``) has no cross-attention (``cross_attn`` and its norm None)."""

    def __init__(self, config: Config, params: dict[str, np.ndarray], name: str):
        super().__init__(name="decoder_layer")
        self.norm_first, self.rate = config.norm_first, config.dropout
        attention, norm = (functools.partial(m, config, params) for m in (MultiHeadAttention, LayerNorm))
        self.self_attn, self.self_attn_norm = attention(f"{name}.self_attn"), norm(f"{name}.self_attn_norm")
        self.cross_attn, self.cross_attn_norm = (None, None) if config.decoder_only else (
            attention(f"{name}.cross_attn"), norm(f"{name}.cross_attn_norm"))
        self.ffn, self.ffn_norm = FeedForward(config, params, f"{name}.ffn"), norm(f"{name}.ffn_norm")

    def forward(self, y: tf.Tensor, self_kv: tuple[tf.Tensor, tf.Tensor], self_mask: tf.Tensor,
                memory_kv: tuple[tf.Tensor, tf.Tensor] | None, memory_mask: tf.Tensor | None, start: tf.Tensor | int,
                rng: tf.Tensor | None = None) -> tuple[tf.Tensor, tuple[tf.Tensor, tf.Tensor]]:
        """n new tokens y (B, n, D) at positions ``start...``: self_kv, this layer's (k (B, H, P, K),
        v (B, H, P, C)) holding positions < start; self_mask (B, 1, n, P) (causal and key padding); memory_kv
        (k (B, H, S, K), v (B, H, S, C)); memory_mask (B, 1, 1, S), both None in a decoder-only model; ``rng`` as
        ``layers.dropout``'s. -> (B, n, D) and self_kv with the new keys/values written at ``start...``."""
        pre = self.norm_first
        h = self.self_attn_norm.forward(y) if pre else y
        self_kv = tuple(write_kv(cache, new, start) for cache, new in zip(self_kv, self.self_attn.project_kv(h),
                                                                          strict=True))
        h = self.self_attn.forward(h, self_kv, self_mask)
        y = residual_add(y, dropout(h, "self_attn", self.rate, rng))
        y = record("self_attn.residual", y if pre else self.self_attn_norm.forward(y))
        if self.cross_attn is not None:
            h = self.cross_attn.forward(self.cross_attn_norm.forward(y) if pre else y, memory_kv, memory_mask)
            y = residual_add(y, dropout(h, "cross_attn", self.rate, rng))
            y = record("cross_attn.residual", y if pre else self.cross_attn_norm.forward(y))
        h = self.ffn.forward(self.ffn_norm.forward(y) if pre else y)
        y = residual_add(y, dropout(h, "ffn", self.rate, rng))
        return record("ffn.residual", y if pre else self.ffn_norm.forward(y)), self_kv


class Stack(tf.Module):
    """``n`` layers of one kind under the canonical prefix ``name`` (section 3.1); pre-LN adds a final LayerNorm:
    what the encoder and decoder stacks share."""

    def __init__(self, config: Config, params: dict[str, np.ndarray], layer: type[tf.Module], name: str, n: int):
        super().__init__(name=name)
        self.layers = [layer(config, params, f"{name}.layers.{i}") for i in range(n)]
        self.final_norm = LayerNorm(config, params, f"{name}.final_norm") if config.norm_first else None


class Encoder(Stack):
    """N encoder layers (section 3.1); pre-LN adds a final LayerNorm."""

    def __init__(self, config: Config, params: dict[str, np.ndarray]):
        super().__init__(config, params, EncoderLayer, "encoder", config.n_encoder_layers)

    def forward(self, x: tf.Tensor, mask: tf.Tensor, rng: tf.Tensor | None = None) -> tf.Tensor:
        """x (B, S, D), key padding mask (B, 1, 1, S) -> memory (B, S, D); ``rng`` as ``layers.dropout``'s."""
        for i, layer in enumerate(self.layers):
            with scope(f"encoder.layers.{i}"):
                x = record("out", layer.forward(x, mask, rng))
        if self.final_norm is not None:
            x = self.final_norm.forward(x)
        return record("encoder.out", x)


class Decoder(Stack):
    """N decoder layers over a KV cache (section 3.1); pre-LN adds a final LayerNorm."""

    def __init__(self, config: Config, params: dict[str, np.ndarray]):
        super().__init__(config, params, DecoderLayer, "decoder", config.n_decoder_layers)

    def forward(self, y: tf.Tensor, cache: KVCache, rng: tf.Tensor | None = None) -> tuple[tf.Tensor, KVCache]:
        """y (B, n, D) at positions ``cache.length...``, whose keys are already in ``cache.key_mask`` -> (h (B, n, D),
        the cache with their keys/values written). Self-attention sees the cached positions and the new ones
        causally, minus padding keys; ``rng`` as ``layers.dropout``'s."""
        start, n, capacity = cache.length, tf.shape(y)[1], tf.shape(cache.key_mask)[1]
        self_mask = causal_mask(start, n, capacity)[None, None] & cache.key_mask[:, None, None, :]  # (B, 1, n, P)
        memory_mask = None if cache.memory_mask is None else cache.memory_mask[:, None, None, :]  # (B, 1, 1, S)
        self_kv = []
        for i, layer in enumerate(self.layers):
            with scope(f"decoder.layers.{i}"):
                memory_kv = cache.memory_kv[i] if cache.memory_kv else None                      # decoder-only: none
                y, kv = layer.forward(y, cache.self_kv[i], self_mask, memory_kv, memory_mask, start, rng)
                record("out", y)
            self_kv.append(kv)
        if self.final_norm is not None:
            y = self.final_norm.forward(y)
        return record("decoder.out", y), cache._replace(self_kv=tuple(self_kv), length=start + n)


def encoder_memory(model: Transformer, src: tf.Tensor, rng: tf.Tensor | None = None) -> tf.Tensor:
    """src (B, S) int32 -> memory (B, S, D): embedding and encoder (sections 3.1-3.5); ``rng`` as
    ``layers.dropout``'s."""
    x = dropout(model.embedder.encode(src), "src_embed", model.config.dropout, rng)              # (B, S, D)
    return model.encoder.forward(x, key_padding_mask(src, model.config.pad_id)[:, None, None, :], rng)


def empty_cache(model: tf.Module, batch: int | tf.Tensor, capacity: int | tf.Tensor) -> KVCache:
    """An empty cache of ``capacity`` positions for ``batch`` rows, without memory: a decoder-only model's."""
    c, zeros = model.config, lambda d: tf.zeros([batch, model.config.n_heads, capacity, d], model.embedder.dtype)
    return KVCache(self_kv=tuple((zeros(c.d_k), zeros(c.d_v)) for _ in model.decoder.layers),
                   key_mask=tf.zeros([batch, capacity], tf.bool), memory_kv=(), memory_mask=None,
                   length=tf.constant(0, tf.int32))


def source_cache(model: Transformer, memory: tf.Tensor, src: tf.Tensor, capacity: int | tf.Tensor) -> KVCache:
    """An empty cache of ``capacity`` target positions for memory (B, S, D) of source src (B, S) int32."""
    return empty_cache(model, tf.shape(memory)[0], capacity)._replace(
        memory_kv=tuple(layer.cross_attn.project_kv(memory) for layer in model.decoder.layers),
        memory_mask=key_padding_mask(src, model.config.pad_id))


def decoder_logits(model: tf.Module, tokens: tf.Tensor, cache: KVCache, rng: tf.Tensor | None = None, *,
                   at: tf.Tensor | None = None) -> tuple[tf.Tensor, KVCache]:
    """tokens (B, n) int32 at positions ``cache.length...`` -> (logits (B, n, V) float32, or (B, 1, V) of new
    position ``at`` alone, the updated cache): embedding, decoder, tied output projection; ``rng`` as
    ``layers.dropout``'s."""
    key_mask = write_kv(cache.key_mask, key_padding_mask(tokens, model.config.pad_id), cache.length)  # (B, P)
    y = dropout(model.embedder.encode(tokens, cache.length), "tgt_embed", model.config.dropout, rng)  # (B, n, D)
    h, cache = model.decoder.forward(y, cache._replace(key_mask=key_mask), rng)                      # (B, n, D)
    h = h if at is None else tf.gather(h, [at], axis=1)  # a prefill needs its last position only
    return record("logits", model.embedder.decode(h)), cache


def forward_logits(model: Transformer, src: tf.Tensor, tgt_in: tf.Tensor, rng: tf.Tensor | None = None
                   ) -> tf.Tensor:
    """src (B, S), tgt_in (B, T) int32 -> logits (B, T, V) float32: the decoder's one code path over an empty
    cache of capacity T; ``rng`` as ``layers.dropout``'s."""
    memory = encoder_memory(model, src, rng)                                                      # (B, S, D)
    return decoder_logits(model, tgt_in, source_cache(model, memory, src, tf.shape(tgt_in)[1]), rng)[0]
