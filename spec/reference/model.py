"""The Transformer (Vaswani et al., 2017) in NumPy: encoder and decoder stacks over ``spec.reference.layers``.

The decoder has one code path: ``decode`` consumes ``n`` new target tokens against a ``KVCache`` of
everything before them. A full forward is one call with all T tokens and an empty cache; incremental decoding
is T calls of one token. Intermediates are recorded through ``spec.recording`` under the names of
``spec.shapes.intermediates``.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from spec import validate
from spec.config import Config
from spec.numerics import Numerics
from spec.recording import record, recording, scope
from spec.reference.layers import DecoderLayer, Embedder, EncoderLayer, LayerNorm, Params, Rng, dropout


@dataclasses.dataclass
class KVCache:
    """The decoder state (``spec.api``): per decoder layer the self-attention buffer ``self_kv`` (k (B, H, P, K),
    v (B, H, P, C)) written at positions < ``length``, ``key_mask`` (B, P) True at a written non-pad position,
    the encoder output's cross-attention ``memory_kv`` (k (B, H, S, K), v (B, H, S, C)) and ``memory_mask``
    (B, S); a decoder-only model's has ``memory_kv`` [] and ``memory_mask`` None. ``decode`` writes it in place and
    returns it."""

    self_kv: list[tuple[np.ndarray, np.ndarray]]
    key_mask: np.ndarray
    memory_kv: list[tuple[np.ndarray, np.ndarray]]
    memory_mask: np.ndarray
    length: int


def key_padding_mask(ids: np.ndarray, pad_id: int) -> np.ndarray:
    """(B, L) ids -> (B, L) bool, True where the token is not padding."""
    return ids != pad_id


def causal_mask(start: int, n: int, length: int) -> np.ndarray:
    """(1, n, length) bool: the query at position start + i may attend key j <= start + i."""
    q_pos = np.arange(start, start + n)[:, None]
    return (np.arange(length)[None, :] <= q_pos)[None]


class Stack:
    """``n`` layers of one kind under the canonical prefix ``name``, and the final LayerNorm of a pre-LN model
    (section 3.1): what the encoder and decoder stacks share."""

    def __init__(self, params: Params, c: Config, nx: Numerics, layer: type, name: str, n: int):
        self.layers = [layer(params, f"{name}.layers.{i}", c, nx) for i in range(n)]
        self.final_norm = LayerNorm(params, f"{name}.final_norm", c.layer_norm_eps, nx) if c.norm_first else None


class Encoder(Stack):
    """The encoder stack (section 3.1), and the final LayerNorm of a pre-LN model."""

    def __init__(self, params: Params, c: Config, nx: Numerics):
        super().__init__(params, c, nx, EncoderLayer, "encoder", c.n_encoder_layers)

    def forward(self, x: np.ndarray, mask: np.ndarray, rng: Rng = None) -> np.ndarray:
        """x (B, S, D), mask (B, 1, S) -> memory (B, S, D); dropout from ``rng``."""
        for i, layer in enumerate(self.layers):
            with scope(f"encoder.layers.{i}"):
                x = record("out", layer.forward(x, mask, rng))
        return x if self.final_norm is None else self.final_norm.forward(x)


class Decoder(Stack):
    """The decoder stack (section 3.1), and the final LayerNorm of a pre-LN model."""

    def __init__(self, params: Params, c: Config, nx: Numerics):
        super().__init__(params, c, nx, DecoderLayer, "decoder", c.n_decoder_layers)

    def forward(self, y: np.ndarray, cache: KVCache, rng: Rng = None) -> tuple[np.ndarray, KVCache]:
        """n new positions y (B, n, D) at ``cache.length``.. (their ``key_mask`` written) -> (h (B, n, D), cache);
        dropout from ``rng``.

        Self-attention sees every earlier position and the new ones causally, minus padding keys.
        """
        start, end = cache.length, cache.length + y.shape[1]
        self_mask = causal_mask(start, y.shape[1], end) & cache.key_mask[:, None, :end]      # (B, n, end)
        memory_mask = None if cache.memory_mask is None else cache.memory_mask[:, None]      # (B, 1, S)
        for i, layer in enumerate(self.layers):
            with scope(f"decoder.layers.{i}"):
                memory_kv = cache.memory_kv[i] if cache.memory_kv else None                  # decoder-only: none
                y, cache.self_kv[i] = layer.forward(y, cache.self_kv[i], self_mask, memory_kv, memory_mask, start,
                                                    rng)
                record("out", y)
        cache.length = end
        return (y if self.final_norm is None else self.final_norm.forward(y)), cache


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
