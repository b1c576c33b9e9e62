"""The encoder-decoder Transformer (Vaswani et al., 2017, section 3) as a pytree of ``impl_jax.layers`` modules.

``Transformer`` is a ``layers.Module``: its children are the ``Embedder``, ``Encoder`` and ``Decoder`` modules
(leaves: the parameters, key paths: their canonical names) and its static aux data the frozen
``spec.config.Config``, so it passes through ``jax.jit``, ``jax.tree.map`` and ``jax.device_put`` like any pytree.
The decoder stack, the ``KVCache`` and ``decode`` serve the decoder-only ``impl_jax.lm.LanguageModel`` as well.

Its methods are the public API (``spec.api``): they validate their input on host copies with ``spec.validate``
before anything is converted, traced or computed (inside the caller's ``jax.jit`` the ids are tracers: then the
checks that need only shapes and dtypes run), pad the batch and the lengths to buckets (``spec.shapes``), so a
stream of varying shapes compiles a bounded number of programs (each logs one line at INFO on the ``"impl_jax"``
logger), and run jitted programs (``numerics.jit``) keyed by the static config.

``forward`` and ``encode`` compute on the weights rounded to ``config.dtype`` and held in fp32 (``numerics.round_to``:
products with many rows run faster upcast), ``init_cache`` and ``decode`` on the weights in ``config.dtype``: the
same values, and the same results up to the order of fp32 sums.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from impl_jax import numerics
from impl_jax.inputs import Ids, device_ids, host_ids
from impl_jax.layers import KV, DecoderLayer, Embedder, EncoderLayer, LayerNorm, Module, dropout, split
from spec import shapes, validate
from spec.config import Config
from spec.init import init_params
from spec.recording import record, recording, scope

log = logging.getLogger("impl_jax")


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
        for i, (layer, key) in enumerate(zip(self.layers, split(rng, len(self.layers)), strict=True)):
            with scope(f"encoder.layers.{i}"):
                x = record("out", layer(x, mask, key))
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
        for i, (layer, key) in enumerate(zip(self.layers, split(rng, len(self.layers)), strict=True)):
            with scope(f"decoder.layers.{i}"):
                memory_kv = cache.memory_kv[i] if cache.memory_kv else None                      # decoder-only: none
                y, kv = layer(y, cache.self_kv[i], self_mask, memory_kv, memory_mask, start, key)
                record("out", y)
            self_kv.append(kv)
        if self.final_norm is not None:
            y = self.final_norm(y)
        return record("decoder.out", y), cache._replace(self_kv=tuple(self_kv), length=start + n)


class Transformer(Module):
    """The Transformer of section 3 (``spec.api``): ``Transformer(config, seed=0)`` holds ``spec.init_params(config,
    seed)``, the same bits as every other backend's; ``params=`` (keyword-only: canonical ``{name: array}``, taken
    as they are; ``impl_jax.from_params`` checks them) holds given weights instead. Parameters keep their stored
    dtype (``config.param_dtype``). The model has no mode: its methods evaluate unless given a dropout ``rng``.
    Its methods work inside the caller's ``jax.jit`` (compiled with ``numerics.XLA_OPTIONS``)::

        logits = jax.jit(lambda m, s, t: m(s, t), compiler_options=impl_jax.XLA_OPTIONS)(model, src, tgt_in)
    """

    embedder: Embedder
    encoder: Encoder
    decoder: Decoder
    config: Config = dataclasses.field(metadata={"static": True})

    def __init__(self, config: Config, seed: int = 0, *, params: dict[str, Any] | None = None):
        validate.check_model_kind(config, decoder_only=False)
        params = _weights(config, seed, params)
        vars(self).update(embedder=Embedder(config, params), encoder=Encoder(config, params),
                          decoder=Decoder(config, params), config=config)

    def forward(self, src: Ids, tgt_in: Ids, intermediates: bool = False, *, rng: jax.Array | None = None):
        """Teacher-forced forward (section 3): src (B, S), tgt_in (B, T) int -> logits (B, T, V) float32, or with
        ``intermediates`` ``(logits, {name: jax.Array})``; dropout from a PRNG key ``rng`` (training)."""
        c = self.config
        src_host, tgt_host = host_ids(src, c), host_ids(tgt_in, c, "tgt_in")
        validate.check_forward(src_host, tgt_host, c)
        (B, S), T = src_host.shape, tgt_host.shape[1]
        Bb = shapes.batch_bucket(B)
        src = device_ids(src, Bb, shapes.length_bucket(S, c.max_len), c.pad_id)
        tgt_in = device_ids(tgt_in, Bb, shapes.length_bucket(T, c.max_len), c.pad_id)
        logits, rec = _forward(self, src, tgt_in, bool(intermediates), rng)
        if not intermediates:
            return logits[:B, :T]
        want = shapes.intermediates(c, B, S, T, dropout=rng is not None)  # name -> ((B, S or T, ...), dtype)
        return logits[:B, :T], {name: x[:B, :want[name][0][1]] for name, x in rec.items()}

    def encode(self, src: Ids) -> jax.Array:
        """Encoder stack (section 3.1): src (B, S) int -> memory (B, S, D) in ``config.dtype``."""
        c = self.config
        host = host_ids(src, c)
        validate.check_source(host, c)
        B, S = host.shape
        src = device_ids(src, shapes.batch_bucket(B), shapes.length_bucket(S, c.max_len), c.pad_id)
        return _compiled(_encode, self, src)[:B, :S]

    def init_cache(self, memory: jax.Array, src: Ids, capacity: int) -> KVCache:
        """An empty ``KVCache`` of exactly ``capacity`` positions (not bucketed) for ``memory`` (B, S, D) of
        ``src`` (B, S); the cross-attention K/V of ``memory`` computed here, once (section 3.2.3)."""
        c = self.config
        host = host_ids(src, c)
        validate.check_source(host, c)
        validate.check_capacity(capacity, c)
        if tuple(memory.shape) != (*host.shape, c.d_model):
            raise ValueError(f"memory shape {tuple(memory.shape)} does not match src {host.shape} and d_model")
        src = device_ids(src, *host.shape, c.pad_id)
        return _compiled(_init_cache, self, memory, src, capacity=int(capacity))

    def decode(self, tokens: Ids, cache: KVCache) -> tuple[jax.Array, KVCache]:
        """n new tokens (B, n) int at positions ``cache.length ..`` -> (logits (B, n, V) float32, the new cache)
        (``decode``)."""
        return decode(self, tokens, cache)


def decode(model: Module, tokens: Ids, cache: KVCache) -> tuple[jax.Array, KVCache]:
    """The decoder of either model (``Transformer``, ``impl_jax.lm.LanguageModel``), checked and compiled: tokens
    (B, n) at ``cache.length ..`` -> (logits (B, n, V) float32, the new cache); inside the caller's jit (a traced
    ``cache.length``) the capacity is checked as if the cache were empty."""
    c = model.config
    host = host_ids(tokens, c, "tokens")
    length = 0 if isinstance(cache.length, jax.core.Tracer) else int(cache.length)
    validate.check_decode(host, c, cache.key_mask.shape[0], length, cache.key_mask.shape[1])
    return _compiled(_decode, model, device_ids(tokens, *host.shape, c.pad_id), cache)


# ----------------------------------------------------------------- unchecked internals (validated, bucketed ids)

def _encode(model: Transformer, src: jax.Array, rng: jax.Array | None = None) -> jax.Array:
    """Traced, on the model's weights as they are: src (B, S) -> memory (B, S, D) (section 3.1); dropout from
    ``rng``."""
    mask = key_padding_mask(src, model.config.pad_id)[:, None, None, :]                    # (B, 1, 1, S)
    embed_rng, rng = split(rng, 2)
    x = dropout(model.embedder.encode(src), "src_embed", model.config.dropout, embed_rng)   # (B, S, D)
    return model.encoder(x, mask, rng)


def _empty_cache(model: Module, batch: int, capacity: int) -> KVCache:
    """An empty ``KVCache`` of static ``batch`` and ``capacity`` without cross-attention K/V (a decoder-only
    model's). On the CPU a bf16 cache holds its keys and values in fp32 (the same values): XLA's CPU backend has no
    bf16 x bf16 -> fp32 batched dot and would convert the cache at every step."""
    c = model.config
    dt = jnp.float32 if c.dtype == "bfloat16" and jax.default_backend() == "cpu" else jnp.dtype(c.dtype)
    empty = (jnp.zeros((batch, c.n_heads, capacity, c.d_k), dt), jnp.zeros((batch, c.n_heads, capacity, c.d_v), dt))
    return KVCache(tuple(empty for _ in range(c.n_decoder_layers)), jnp.zeros((batch, capacity), bool), (), None,
                   jnp.zeros((), jnp.int32))


def _init_cache(model: Transformer, memory: jax.Array, src: jax.Array, capacity: int) -> KVCache:
    """Traced, on the model's weights as they are: ``_empty_cache`` of static ``capacity`` with the cross-attention
    K/V of ``memory`` (B, S, D), in the cache's dtype."""
    cache = _empty_cache(model, memory.shape[0], capacity)
    memory_kv = tuple(tuple(t.astype(cache.self_kv[0][0].dtype) for t in layer.cross_attn.project_kv(memory))
                      for layer in model.decoder.layers)
    return cache._replace(memory_kv=memory_kv, memory_mask=key_padding_mask(src, model.config.pad_id))


def _decode(model: Module, tokens: jax.Array, cache: KVCache, rng: jax.Array | None = None, *,
            at: jax.Array | None = None) -> tuple[jax.Array, KVCache]:
    """Traced, on either model's weights as they are: tokens (B, n) at positions ``cache.length ..`` -> (logits
    (B, n, V) float32, or (B, 1, V) of new position ``at`` alone, the updated cache); dropout from ``rng``."""
    c, start = model.config, cache.length
    key_mask = lax.dynamic_update_slice_in_dim(cache.key_mask, key_padding_mask(tokens, c.pad_id), start, axis=1)
    embed_rng, rng = split(rng, 2)
    y = dropout(model.embedder.encode(tokens, start), "tgt_embed", c.dropout, embed_rng)  # (B, n, D)
    h, cache = model.decoder(y, cache._replace(key_mask=key_mask), rng)
    h = h if at is None else lax.dynamic_slice_in_dim(h, at, 1, axis=1)  # a prefill needs its last position only
    return record("logits", model.embedder.decode(h)), cache


def _weights(config: Config, seed: int, params: dict[str, Any] | None) -> dict[str, jax.Array]:
    """A model's weights on the device: ``params`` as they are, else ``spec.init_params(config, seed)``."""
    return {name: jnp.asarray(x) for name, x in (init_params(config, seed) if params is None else params).items()}


# ----------------------------------------------------------------- the compiled programs

@functools.partial(numerics.jit, static_argnames=("intermediates",))
def _forward(model: Transformer, src: jax.Array, tgt_in: jax.Array, intermediates: bool, rng: jax.Array | None):
    """``Transformer.forward``'s program, on the weights rounded to ``config.dtype`` and held in fp32."""
    c = model.config
    log.info("impl_jax: compiling forward for batch %d, source length %d, target length %d (buckets)%s",
             *src.shape, tgt_in.shape[1], ", with intermediates" if intermediates else "")
    model = jax.tree.map(lambda p: numerics.round_to(p, c.dtype), model)
    encoder_rng, decoder_rng = split(rng, 2)
    # Recording runs here, at trace time, into this trace's own dict: a caller's open ``recording`` never catches
    # these tracers (which would leak, and only on the first trace).
    with recording() as rec:
        cache = _init_cache(model, _encode(model, src, encoder_rng), src, tgt_in.shape[1])  # capacity T
        logits, _ = _decode(model, tgt_in, cache, decoder_rng)                                 # (B, T, V)
    return logits, rec if intermediates else {}


@functools.partial(numerics.jit, static_argnums=(0,), static_argnames=("capacity",))
def _compiled(body: Any, model: Module, *args: Any, capacity: int | None = None) -> Any:
    """The program of ``encode``, ``init_cache`` or ``decode``: ``body`` (``_encode``, ``_init_cache``,
    ``_decode``) on ``args``, ``_encode`` on the weights rounded to ``config.dtype`` and held in fp32, the others on
    the weights in ``config.dtype``."""
    c = model.config
    log.info("impl_jax: compiling %s for ids %s%s", body.__name__[1:], tuple(args[body is _init_cache].shape),
             "" if capacity is None else f", capacity {capacity}")
    convert = (lambda p: numerics.round_to(p, c.dtype)) if body is _encode else (lambda p: p.astype(c.dtype))
    return body(jax.tree.map(convert, model), *args, *([] if capacity is None else [capacity]))
