"""The encoder-decoder Transformer (Vaswani et al., 2017, section 3) as a tf.Module, with a preallocated KV cache.

The decoder has one code path, as in ``spec.reference``: ``decode`` consumes n new target tokens against a
``KVCache`` of everything before them. A teacher-forced forward is one call with all T tokens and an empty
cache; incremental decoding is T calls of one token. Hot paths run as ``tf.function(jit_compile=True)`` with
shape-polymorphic input signatures: traced once, compiled by XLA once per concrete shape.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from impl_tf.layers import DecoderLayer, Embedding, EncoderLayer, LayerNorm, Record, _record, write_kv
from spec import validate
from spec.config import Config
from spec.schema import param_specs
from spec.weights_io import check_params

IDS = tf.TensorSpec([None, None], tf.int32)


class KVCache(NamedTuple):
    """Decoder state, fixed-shape so it can live in a compiled ``tf.while_loop``; a nest of tensors.

    Self-attention keys/values are preallocated to a capacity T_max and written in place; cross-attention
    keys/values are computed once per source (``Transformer.init_cache``).
    """

    self_k: tuple[tf.Tensor, ...]     # per decoder layer (B, T_max, H, K)
    self_v: tuple[tf.Tensor, ...]     # per decoder layer (B, T_max, H, C)
    key_mask: tf.Tensor               # (B, T_max) bool: True = a written, non-pad target position
    length: tf.Tensor                 # () int32: positions written so far
    memory_k: tuple[tf.Tensor, ...]   # per decoder layer (B, S, H, K)
    memory_v: tuple[tf.Tensor, ...]   # per decoder layer (B, S, H, C)
    memory_mask: tf.Tensor            # (B, S) bool: True = non-pad source position

    def select(self, rows: tf.Tensor, memory: bool = True) -> KVCache:
        """The cache of batch rows ``rows`` (B',) int32.

        ``memory=False`` keeps the cross-attention part as it is: right when ``rows`` only permutes rows of
        the same source (beams of one sentence), whose memory rows are identical.
        """
        take = lambda xs: tuple(tf.gather(x, rows) for x in xs)  # noqa: E731
        cache = self._replace(self_k=take(self.self_k), self_v=take(self.self_v),
                              key_mask=tf.gather(self.key_mask, rows))
        if not memory:
            return cache
        return cache._replace(memory_k=take(self.memory_k), memory_v=take(self.memory_v),
                              memory_mask=tf.gather(self.memory_mask, rows))


def as_ids(ids) -> tf.Tensor:
    """Token ids already checked by ``spec.validate`` (so within [0, vocab_size)) as an int32 tensor."""
    return tf.constant(np.asarray(ids).astype(np.int32))


class Encoder(tf.Module):
    """Embedding and N encoder layers (section 3.1); pre-LN adds a final LayerNorm."""

    def __init__(self, c: Config, params: dict[str, np.ndarray], embedding: Embedding):
        super().__init__(name="encoder")
        self.pad_id = c.pad_id
        self.embedding = embedding
        self.layers = [EncoderLayer(c, params, f"encoder.layers.{i}") for i in range(c.n_encoder_layers)]
        self.final_norm = LayerNorm(c, params, "encoder.final_norm") if c.norm_first else None

    def __call__(self, src: tf.Tensor, rec: Record = None) -> tf.Tensor:
        """src (B, S) int32 -> memory (B, S, D); keys at ``pad_id`` are masked out."""
        mask = (src != self.pad_id)[:, None, None, :]                         # (B, 1, 1, S) key padding mask
        x = _record(rec, "src_embed", self.embedding(src))                    # (B, S, D)
        for i, layer in enumerate(self.layers):
            x = _record(rec, f"encoder.layers.{i}.out", layer(x, mask, rec))
        if self.final_norm is not None:
            x = self.final_norm(x)
        return _record(rec, "encoder.out", x)


class Decoder(tf.Module):
    """Embedding, N decoder layers over a KV cache (section 3.1), and the tied output projection (section 3.4)."""

    def __init__(self, c: Config, params: dict[str, np.ndarray], embedding: Embedding):
        super().__init__(name="decoder")
        self.c = c
        self.embedding = embedding
        self.layers = [DecoderLayer(c, params, f"decoder.layers.{i}") for i in range(c.n_decoder_layers)]
        self.final_norm = LayerNorm(c, params, "decoder.final_norm") if c.norm_first else None

    def init_cache(self, memory: tf.Tensor, src: tf.Tensor, capacity: int | tf.Tensor) -> KVCache:
        """An empty cache of ``capacity`` target positions for memory (B, S, D) of source src (B, S)."""
        c, B = self.c, tf.shape(memory)[0]
        kv = [layer.cross_attn.key_value(memory) for layer in self.layers]
        zeros = lambda d: tuple(tf.zeros([B, capacity, c.n_heads, d], memory.dtype) for _ in self.layers)  # noqa: E731
        return KVCache(zeros(c.d_k), zeros(c.d_v), tf.zeros([B, capacity], tf.bool), tf.constant(0, tf.int32),
                       tuple(k for k, _ in kv), tuple(v for _, v in kv), src != c.pad_id)

    def __call__(self, tokens: tf.Tensor, cache: KVCache, rec: Record = None) -> tuple[tf.Tensor, KVCache]:
        """tokens (B, n) int32 at positions ``cache.length...`` -> float32 logits (B, n, V) and the updated cache.

        Self-attention sees the cached positions and the new ones causally, minus padding keys.
        """
        start, n, capacity = cache.length, tf.shape(tokens)[1], tf.shape(cache.key_mask)[1]
        key_mask = write_kv(cache.key_mask, tokens != self.c.pad_id, start)                  # (B, T_max)
        causal = tf.range(capacity)[None, :] <= (start + tf.range(n))[:, None]                 # (n, T_max)
        self_mask = causal[None, None] & key_mask[:, None, None, :]                           # (B, 1, n, T_max)
        memory_mask = cache.memory_mask[:, None, None, :]                                     # (B, 1, 1, S)
        y = _record(rec, "tgt_embed", self.embedding(tokens, start))                          # (B, n, D)
        self_k, self_v = [], []
        for i, layer in enumerate(self.layers):
            y, (k, v) = layer(y, (cache.self_k[i], cache.self_v[i]), start, self_mask,
                              (cache.memory_k[i], cache.memory_v[i]), memory_mask, rec)
            _record(rec, f"decoder.layers.{i}.out", y)
            self_k.append(k)
            self_v.append(v)
        if self.final_norm is not None:
            y = self.final_norm(y)
        logits = _record(rec, "logits", self.embedding.logits(_record(rec, "decoder.out", y)))  # (B, n, V) fp32
        return logits, cache._replace(self_k=tuple(self_k), self_v=tuple(self_v), key_mask=key_mask, length=start + n)


class Transformer(tf.Module):
    """The Transformer of "Attention Is All You Need", built from canonical parameters.

    Args:
        config: a ``spec.config.Config``.
        params: canonical name -> NumPy array (``spec.schema``), e.g. from ``spec.init_params(config, seed)`` or
            ``spec.load_weights``; bf16 as ``ml_dtypes.bfloat16``.

    Raises:
        ValueError: from ``spec.weights_io.check_params``, naming the offending tensor.
    """

    def __init__(self, config: Config, params: dict[str, np.ndarray]):
        super().__init__(name="transformer")
        check_params(config, params)
        self.config = config
        self.embedding = Embedding(config, params)
        self.encoder = Encoder(config, params, self.embedding)
        self.decoder = Decoder(config, params, self.embedding)
        self._loops = {}  # compiled generation loops, by kind (impl_tf.generate)
        compile_ = functools.partial(tf.function, jit_compile=True)
        self._encode = compile_(lambda src: self.encoder(src), input_signature=[IDS])
        self._forward = compile_(functools.partial(self._teacher_forced, record=False), input_signature=[IDS, IDS])
        self._forward_rec = compile_(functools.partial(self._teacher_forced, record=True), input_signature=[IDS, IDS])
        self._decode = compile_(lambda tokens, cache: self.decoder(tokens, cache),
                                input_signature=[IDS, self._cache_spec()])

    def _cache_spec(self) -> KVCache:
        """Shape-polymorphic signature of a KVCache: one trace serves every batch size and capacity."""
        c, L, act = self.config, self.config.n_decoder_layers, self.embedding.dtype
        spec = lambda d: (tf.TensorSpec([None, None, c.n_heads, d], act),) * L  # noqa: E731
        return KVCache(spec(c.d_k), spec(c.d_v), tf.TensorSpec([None, None], tf.bool), tf.TensorSpec([], tf.int32),
                       spec(c.d_k), spec(c.d_v), tf.TensorSpec([None, None], tf.bool))

    def parameters(self) -> dict[str, tf.Variable]:
        """Canonical parameter name -> tf.Variable (the shared embedding once), in ``spec.schema`` order."""
        by_name = {v.name.removesuffix(":0"): v for v in self.variables}
        return {s.name: by_name[s.name] for s in param_specs(self.config)}

    def _teacher_forced(self, src: tf.Tensor, tgt_in: tf.Tensor, record: bool):
        rec = {} if record else None
        memory = self.encoder(src, rec)
        logits, _ = self.decoder(tgt_in, self.decoder.init_cache(memory, src, tf.shape(tgt_in)[1]), rec)
        return (logits, rec) if record else logits

    def forward(self, src, tgt_in, intermediates: bool = False):
        """Teacher-forced forward: src (B, S), tgt_in (B, T) int -> logits (B, T, V) float32.

        With ``intermediates=True`` returns ``(logits, {name: tensor})`` with the tensors of
        ``spec.shapes.intermediates`` (activations in the config's dtype).

        Raises:
            ValueError: from ``spec.validate.check_forward``, before any computation.
        """
        validate.check_forward(np.asarray(src), np.asarray(tgt_in), self.config)
        src, tgt_in = as_ids(src), as_ids(tgt_in)
        return self._forward_rec(src, tgt_in) if intermediates else self._forward(src, tgt_in)

    def encode(self, src) -> tf.Tensor:
        """src (B, S) int -> memory (B, S, D) in the config's dtype.

        Raises:
            ValueError: from ``spec.validate.check_source``, before any computation.
        """
        validate.check_source(np.asarray(src), self.config)
        return self._encode(as_ids(src))

    def init_cache(self, memory: tf.Tensor, src, capacity: int) -> KVCache:
        """An empty KV cache for ``capacity`` target positions; cross-attention K/V of memory (B, S, D) computed once.

        Raises:
            ValueError: from ``spec.validate.check_source`` and ``check_capacity`` (an int in [1, max_len]),
                or if the batch sizes of memory and src differ.
        """
        validate.check_source(np.asarray(src), self.config)
        validate.check_capacity(capacity, self.config)
        if tuple(memory.shape[:2]) != np.shape(src):
            raise ValueError(f"memory shape {tuple(memory.shape)} does not match src shape {np.shape(src)}")
        return self.decoder.init_cache(memory, as_ids(src), int(capacity))

    def decode(self, tokens, cache: KVCache) -> tuple[tf.Tensor, KVCache]:
        """n new target tokens (B, n) int at positions ``cache.length...`` -> logits (B, n, V) float32, new cache.

        A step costs the work of n tokens: projections and FFN run on the new tokens only; attention reads
        the cache.

        Raises:
            ValueError: from ``spec.validate.check_decode``: bad ids, a batch that differs from the cache's, or
                no room in the cache for n more positions.
        """
        B, capacity = cache.key_mask.shape
        validate.check_decode(np.asarray(tokens), self.config, B, int(cache.length), capacity)
        return self._decode(as_ids(tokens), cache)
