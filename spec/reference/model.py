"""The Transformer (Vaswani et al., 2017) in NumPy: the embeddings and the stacks of ``spec.reference.stacks``.

The decoder has one code path: ``decode`` consumes ``n`` new target tokens against a ``KVCache`` of
everything before them. A full forward is one call with all T tokens and an empty cache; incremental decoding
is T calls of one token. Intermediates are recorded through ``spec.recording`` under the names of
``spec.shapes.intermediates``.
"""

from __future__ import annotations

import contextlib

import numpy as np

from spec import validate
from spec.config import Config
from spec.numerics import Numerics
from spec.recording import record, recording
from spec.reference.layers import Embedder, Params, Rng, dropout
from spec.reference.stacks import Decoder, Encoder, KVCache, key_padding_mask


class Transformer:
    """The model of ``params`` (float64, ``as_float64``) computing as ``nx`` says: the ``spec.api`` methods."""

    def __init__(self, params: Params, c: Config, nx: Numerics):
        validate.check_model_kind(c, decoder_only=False)
        self.config, self.nx = c, nx
        self.embedder = Embedder(params, c, nx)
        self.encoder = Encoder(params, c, nx)
        self.decoder = Decoder(params, c, nx)

    def forward(self, src: np.ndarray, tgt_in: np.ndarray, intermediates: bool = False, *, rng: Rng = None):
        """Teacher-forced forward: src (B, S), tgt_in (B, T) -> logits (B, T, V) fp32, with ``intermediates``
        -> (logits, {name: array}); dropout from ``rng`` (``layers.dropout``).

        Raises:
            ValueError: from ``spec.validate.check_forward``.
        """
        validate.check_forward(src, tgt_in, self.config)
        with recording() if intermediates else contextlib.nullcontext() as rec:
            memory = self.encode(src, rng)
            logits, _ = self.decode(tgt_in, self.init_cache(memory, src, tgt_in.shape[1]), rng)
        return (logits, rec) if intermediates else logits

    def encode(self, src: np.ndarray, rng: Rng = None) -> np.ndarray:
        """Encoder stack: src (B, S) int -> memory (B, S, D); dropout from ``rng``."""
        mask = key_padding_mask(src, self.config.pad_id)[:, None]                              # (B, 1, S)
        x = dropout(self.embedder.encode(src), "src_embed", self.config.dropout, rng, self.nx)
        return record("encoder.out", self.encoder.forward(x, mask, rng))

    def init_cache(self, memory: np.ndarray, src: np.ndarray, capacity: int) -> KVCache:
        """An empty cache of ``capacity`` positions for ``memory`` (B, S, D) of source ``src`` (B, S)."""
        c, B = self.config, memory.shape[0]
        self_kv = [(np.zeros((B, c.n_heads, capacity, c.d_k)), np.zeros((B, c.n_heads, capacity, c.d_v)))
                   for _ in self.decoder.layers]
        memory_kv = [layer.cross_attn.project_kv(memory) for layer in self.decoder.layers]
        return KVCache(self_kv, np.zeros((B, capacity), bool), memory_kv, key_padding_mask(src, c.pad_id), 0)

    def decode(self, tokens: np.ndarray, cache: KVCache, rng: Rng = None) -> tuple[np.ndarray, KVCache]:
        """n new tokens (B, n) at positions ``cache.length``.. -> (logits (B, n, V), cache), written in place;
        dropout from ``rng``."""
        return decode(self, tokens, cache, rng)


def decode(model: Transformer, tokens: np.ndarray, cache: KVCache, rng: Rng = None
           ) -> tuple[np.ndarray, KVCache]:
    """The decoder of either model (``Transformer``, ``spec.reference.lm.LanguageModel``): tokens (B, n) at
    ``cache.length``.. -> (logits (B, n, V), cache)."""
    start = cache.length
    cache.key_mask[:, start:start + tokens.shape[1]] = key_padding_mask(tokens, model.config.pad_id)
    y = dropout(model.embedder.encode(tokens, start), "tgt_embed", model.config.dropout, rng, model.nx)
    h, cache = model.decoder.forward(y, cache, rng)
    return record("logits", model.embedder.decode(record("decoder.out", h))), cache
