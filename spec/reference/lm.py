"""The decoder-only Transformer in NumPy: the decoder stack of ``spec.reference.model`` without cross-attention,
over one token sequence (``config.decoder_only``), with the same KV cache and one decode path."""

from __future__ import annotations

import contextlib

import numpy as np

from spec import validate
from spec.config import Config
from spec.numerics import Numerics
from spec.recording import recording
from spec.reference.layers import Embedder, Params, Rng
from spec.reference.model import decode
from spec.reference.stacks import Decoder, KVCache


class LanguageModel:
    """The decoder-only model (``config.decoder_only``) of ``params`` computing as ``nx`` says: the ``spec.api``
    ``LanguageModel`` methods. The decoder stack without cross-attention over one sequence, the tied embedding as
    the output projection."""

    def __init__(self, params: Params, c: Config, nx: Numerics):
        validate.check_model_kind(c, decoder_only=True)
        self.config, self.nx = c, nx
        self.embedder = Embedder(params, c, nx)
        self.decoder = Decoder(params, c, nx)

    def forward(self, tokens: np.ndarray, intermediates: bool = False, *, rng: Rng = None):
        """tokens (B, T) -> logits (B, T, V) fp32, position t predicting token t + 1; with ``intermediates``
        -> (logits, {name: array}); dropout from ``rng``.

        Raises:
            ValueError: from ``spec.validate.check_tokens``.
        """
        validate.check_tokens("tokens", tokens, self.config)
        with recording() if intermediates else contextlib.nullcontext() as rec:
            logits, _ = self.decode(tokens, self.init_cache(tokens.shape[0], tokens.shape[1]), rng)
        return (logits, rec) if intermediates else logits

    def init_cache(self, batch: int, capacity: int) -> KVCache:
        """An empty cache of ``capacity`` positions for ``batch`` sequences.

        Raises:
            ValueError: from ``spec.validate.check_cache_size``.
        """
        c = self.config
        validate.check_cache_size(batch, capacity, c)
        self_kv = [(np.zeros((batch, c.n_heads, capacity, c.d_k)), np.zeros((batch, c.n_heads, capacity, c.d_v)))
                   for _ in self.decoder.layers]
        return KVCache(self_kv, np.zeros((batch, capacity), bool), [], None, 0)

    def decode(self, tokens: np.ndarray, cache: KVCache, rng: Rng = None) -> tuple[np.ndarray, KVCache]:
        """As ``Transformer.decode``."""
        return decode(self, tokens, cache, rng)
