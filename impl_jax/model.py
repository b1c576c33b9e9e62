"""The encoder-decoder Transformer (Vaswani et al., 2017, section 3): the model, its checked methods, the checked
``decode`` both models share, and the programs they compile.

``Transformer`` is a ``layers.Module``: its children are the ``Embedder`` (``impl_jax.layers``), ``Encoder`` and
``Decoder`` modules (``impl_jax.stacks``; leaves: the parameters, key paths: their canonical names) and its static
aux data the frozen ``spec.config.Config``, so it passes through ``jax.jit``, ``jax.tree.map`` and
``jax.device_put`` like any pytree. The decoder stack, the ``KVCache`` and ``decode`` serve the decoder-only
``impl_jax.lm.LanguageModel`` as well; the unchecked computations the programs run are ``impl_jax.stacks``'.

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
from typing import Any

import jax
import jax.numpy as jnp

from impl_jax import numerics
from impl_jax.inputs import Ids, device_ids, host_ids
from impl_jax.layers import Embedder, Module, without_dropout
from impl_jax.stacks import Decoder, Encoder, KVCache, decoder_logits, encoder_memory, source_cache
from spec import shapes, validate
from spec.config import Config
from spec.init import init_params
from spec.recording import recording

log = logging.getLogger("impl_jax")


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
        params = device_weights(config, seed, params)
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
        model = self if rng is not None else without_dropout(self)  # evaluation: programs shared across dropout
        logits, rec = _forward(model, src, tgt_in, bool(intermediates), rng)
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
        return _compiled(encoder_memory, without_dropout(self), src)[:B, :S]

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
        return _compiled(source_cache, without_dropout(self), memory, src, capacity=int(capacity))

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
    return _compiled(decoder_logits, without_dropout(model), device_ids(tokens, *host.shape, c.pad_id), cache)


def device_weights(config: Config, seed: int, params: dict[str, Any] | None) -> dict[str, jax.Array]:
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
    # Recording runs here, at trace time, into this trace's own dict: a caller's open ``recording`` never catches
    # these tracers (which would leak, and only on the first trace).
    with recording() as rec:
        cache = source_cache(model, encoder_memory(model, src, rng), src, tgt_in.shape[1])  # capacity T
        logits, _ = decoder_logits(model, tgt_in, cache, rng)                             # (B, T, V)
    return logits, rec if intermediates else {}


# The method each body of ``_compiled`` serves, as its compile log line names it.
_METHODS = {encoder_memory: "encode", source_cache: "init_cache", decoder_logits: "decode"}


@functools.partial(numerics.jit, static_argnums=(0,), static_argnames=("capacity",))
def _compiled(body: Any, model: Module, *args: Any, capacity: int | None = None) -> Any:
    """The program of ``encode``, ``init_cache`` or ``decode``: ``body`` (``stacks.encoder_memory``,
    ``source_cache``, ``decoder_logits``) on ``args``, ``encoder_memory`` on the weights rounded to ``config.dtype``
    and held in fp32, the others on the weights in ``config.dtype``."""
    c = model.config
    log.info("impl_jax: compiling %s for ids %s%s", _METHODS[body], tuple(args[body is source_cache].shape),
             "" if capacity is None else f", capacity {capacity}")
    convert = (lambda p: numerics.round_to(p, c.dtype)) if body is encoder_memory else (lambda p: p.astype(c.dtype))
    return body(jax.tree.map(convert, model), *args, *([] if capacity is None else [capacity]))
