"""The decoder-only language model (``config.decoder_only``) as a pytree of ``impl_jax.layers`` modules: the decoder
stack of ``impl_jax.stacks`` without cross-attention, over one token sequence, with the same KV cache and the same
decode path (``impl_jax.model.decode``).

``LanguageModel`` is a ``layers.Module`` as ``Transformer`` is (children ``Embedder`` and ``Decoder``, the config
static aux data), so it passes through ``jax.jit``, ``jax.grad`` and ``jax.tree.map``, and its methods work inside
the caller's jit (compiled with ``numerics.XLA_OPTIONS``). ``forward`` pads the batch and the length to buckets
(``spec.shapes``) and computes on the weights rounded to ``config.dtype`` and held in fp32, ``decode`` on the weights
in ``config.dtype``, as ``Transformer``'s do.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax

from impl_jax import numerics
from impl_jax.inputs import Ids, device_ids, host_ids
from impl_jax.layers import Embedder, Module, without_dropout
from impl_jax.model import decode, device_weights, log
from impl_jax.stacks import Decoder, KVCache, decoder_logits, empty_cache
from spec import shapes, validate
from spec.config import Config
from spec.recording import recording


class LanguageModel(Module):
    """The decoder-only model (``spec.api``): ``LanguageModel(config, seed=0)`` holds ``spec.init_params(config,
    seed)``, the same bits as every other backend's; ``params=`` (keyword-only: canonical ``{name: array}``, taken
    as they are; ``impl_jax.from_params`` checks them) holds given weights instead. No mode: its methods evaluate
    unless given a dropout ``rng``."""

    embedder: Embedder
    decoder: Decoder
    config: Config = dataclasses.field(metadata={"static": True})

    def __init__(self, config: Config, seed: int = 0, *, params: dict[str, Any] | None = None):
        validate.check_model_kind(config, decoder_only=True)
        params = device_weights(config, seed, params)
        vars(self).update(embedder=Embedder(config, params), decoder=Decoder(config, params), config=config)

    def forward(self, tokens: Ids, intermediates: bool = False, *, rng: jax.Array | None = None):
        """tokens (B, T) int -> logits (B, T, V) float32, or with ``intermediates`` ``(logits, {name:
        jax.Array})``; dropout from a PRNG key ``rng`` (training)."""
        c = self.config
        host = host_ids(tokens, c, "tokens")
        validate.check_tokens("tokens", host, c)
        B, T = host.shape
        tokens = device_ids(tokens, shapes.batch_bucket(B), shapes.length_bucket(T, c.max_len), c.pad_id)
        logits, rec = _forward(self if rng is not None else without_dropout(self), tokens, bool(intermediates), rng)
        if not intermediates:
            return logits[:B, :T]
        return logits[:B, :T], {name: x[:B, :T] for name, x in rec.items()}

    def init_cache(self, batch: int, capacity: int) -> KVCache:
        """An empty ``KVCache`` of exactly ``capacity`` positions (not bucketed) for ``batch`` sequences, ``memory_kv``
        ``()`` and ``memory_mask`` None."""
        validate.check_cache_size(batch, capacity, self.config)
        return empty_cache(self, int(batch), int(capacity))

    def decode(self, tokens: Ids, cache: KVCache) -> tuple[jax.Array, KVCache]:
        """n new tokens (B, n) int at positions ``cache.length ..`` -> (logits (B, n, V) float32, the new cache)
        (``impl_jax.model.decode``)."""
        return decode(self, tokens, cache)


@functools.partial(numerics.jit, static_argnames=("intermediates",))
def _forward(model: LanguageModel, tokens: jax.Array, intermediates: bool, rng: jax.Array | None):
    """``LanguageModel.forward``'s program: one decode of every position into an empty cache of their number, on
    the weights rounded to ``config.dtype`` and held in fp32."""
    c = model.config
    log.info("impl_jax: compiling the language model's forward for batch %d, length %d (buckets)%s", *tokens.shape,
             ", with intermediates" if intermediates else "")
    model = jax.tree.map(lambda p: numerics.round_to(p, c.dtype), model)
    with recording() as rec:  # at trace time, into this trace's own dict (as ``Transformer.forward``'s)
        logits, _ = decoder_logits(model, tokens, empty_cache(model, *tokens.shape), rng)
    return logits, rec if intermediates else {}
