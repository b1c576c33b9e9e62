"""The decoder-only language model (``config.decoder_only``) as a tf.Module: ``impl_tf.stacks``' decoder without
cross-attention over one token sequence, with the ``Transformer``'s KV cache, ``decode`` and kinds of programs.

The forward is one decoder call with all T tokens and an empty cache, padded to buckets as the ``Transformer``'s;
``init_cache`` and ``decode`` are not padded (their capacity is the caller's choice).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from impl_tf.inputs import host_ids
from impl_tf.layers import Embedder
from impl_tf.model import Transformer, decode
from impl_tf.programs import model_fields, run_forward
from impl_tf.stacks import Decoder, KVCache, decoder_logits, empty_cache
from spec import validate
from spec.annotations import Float
from spec.config import Config
from spec.init import init_params


class LanguageModel(tf.Module):
    """The decoder-only model holding ``spec.init_params(config, seed)`` or ``params``, as ``Transformer``: the
    decoder stack without cross-attention, the tied embedding as the output projection. Fields: ``config``;
    ``embedder``, ``decoder``; those of ``impl_tf.programs.model_fields``.

    Raises:
        ValueError: from ``spec.validate.check_model_kind`` for an encoder-decoder config, or ``spec.init_params``.
    """

    def __init__(self, config: Config, seed: int = 0, *, params: dict[str, np.ndarray] | None = None):
        validate.check_model_kind(config, decoder_only=True)
        super().__init__(name="language_model")
        params = init_params(config, seed) if params is None else params
        self.config = config
        self.embedder = Embedder(config, params)
        self.decoder = Decoder(config, params)
        model_fields(self)

    def forward(self, tokens, intermediates: bool = False, *, rng=None
                ) -> Float[tf.Tensor, "B T V"] | tuple[Float[tf.Tensor, "B T V"], dict[str, tf.Tensor]]:
        """The causal forward, as ``spec.api``; ids and ``rng`` as ``Transformer.forward``'s."""
        tokens = host_ids(tokens, "tokens")
        validate.check_tokens("tokens", tokens, self.config)
        return run_forward(self, forward_logits, [tokens], intermediates, rng)

    __call__ = forward

    def init_cache(self, batch: int, capacity: int) -> KVCache:
        """An empty ``KVCache`` of ``capacity`` positions for ``batch`` sequences (``memory_kv`` (), ``memory_mask``
        None)."""
        validate.check_cache_size(batch, capacity, self.config)
        return empty_cache(self, int(batch), int(capacity))

    def decode(self, tokens, cache: KVCache) -> tuple[Float[tf.Tensor, "B n V"], KVCache]:
        """As ``Transformer.decode`` (``impl_tf.model.decode``)."""
        return decode(self, tokens, cache)


def forward_logits(model: LanguageModel, tokens: tf.Tensor, rng: tf.Tensor | None = None) -> tf.Tensor:
    """tokens (B, T) int32 -> logits (B, T, V) float32: the decoder's one code path over an empty cache of capacity
    T; ``rng`` as ``layers.dropout``'s."""
    return decoder_logits(model, tokens, empty_cache(model, tf.shape(tokens)[0], tf.shape(tokens)[1]), rng)[0]


Model = Transformer | LanguageModel  # either kind, as the entry points that take both annotate it
