"""The encoder-decoder Transformer (Vaswani et al., 2017, section 3) as a tf.Module, with a preallocated KV cache.

The decoder has one code path, as in ``spec.reference``: ``decode`` consumes n new target tokens against a
``KVCache`` of everything before them. A teacher-forced forward is one call with all T tokens and an empty
cache; incremental decoding is T calls of one token. Hot paths run as ``tf.function(jit_compile=True)`` with
shape-polymorphic input signatures: traced once, compiled by XLA once per concrete shape.

So that varying shapes compile a bounded number of programs, the forward, ``encode`` and the searches pad their
inputs to buckets (``spec.shapes.batch_bucket``, ``length_bucket``; why the padding changes no real result is
written there) and slice the padding off their results. ``init_cache`` and ``decode`` are not padded: their
capacity is the caller's choice.
Each shape compiled for the first time logs one line at INFO on the ``"impl_tf"`` logger.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import tensorflow as tf

from impl_tf.layers import DecoderLayer, Dropout, Embedding, EncoderLayer, LayerNorm, write_kv
from spec import shapes, validate
from spec.config import Config
from spec.init import init_params
from spec.recording import record, recording, scope
from spec.schema import param_specs

IDS = tf.TensorSpec([None, None], tf.int32)
logger = logging.getLogger("impl_tf")

if TYPE_CHECKING:  # shape hints for readers and type checkers (jaxtyping); nothing of it is imported at run time
    from jaxtyping import Bool, Float, Int


class KVCache(NamedTuple):
    """Decoder state for incremental decoding (``spec.api.KV_CACHE_FIELDS``); fixed-shape, so it can live in a
    compiled ``tf.while_loop``; a nest of tensors.

    Self-attention keys/values are preallocated to a capacity P and written in place by ``decode``;
    cross-attention keys/values are computed once per source (``Transformer.init_cache``).
    """

    self_kv: tuple[tuple[Float[tf.Tensor, "B H P K"], Float[tf.Tensor, "B H P C"]], ...]  # per decoder layer
    key_mask: Bool[tf.Tensor, "B P"]  # True = a written, non-pad target position
    memory_kv: tuple[tuple[Float[tf.Tensor, "B H S K"], Float[tf.Tensor, "B H S C"]], ...]  # per decoder layer
    memory_mask: Bool[tf.Tensor, "B S"]  # True = non-pad source position
    length: Int[tf.Tensor, ""]  # int32: positions written so far

    def select(self, rows: tf.Tensor, memory: bool = True) -> KVCache:
        """The cache of batch rows ``rows`` (B',) int32.

        ``memory=False`` keeps the cross-attention part as it is: right when ``rows`` only permutes rows of
        the same source (beams of one sentence), whose memory rows are identical.
        """
        take = lambda kv: tuple(tuple(tf.gather(x, rows) for x in pair) for pair in kv)  # noqa: E731
        cache = self._replace(self_kv=take(self.self_kv), key_mask=tf.gather(self.key_mask, rows))
        if not memory:
            return cache
        return cache._replace(memory_kv=take(self.memory_kv), memory_mask=tf.gather(self.memory_mask, rows))


def as_ids(ids) -> tf.Tensor:
    """Token ids already checked by ``spec.validate`` (so within [0, vocab_size)) as an int32 tensor."""
    return tf.constant(np.asarray(ids).astype(np.int32))


def pad_ids(ids: np.ndarray, batch: int, length: int, pad_id: int) -> tf.Tensor:
    """Checked token ids (B, L) padded to (batch, length) with ``pad_id`` (``spec.shapes.pad_ids``), int32."""
    return tf.constant(shapes.pad_ids(ids, batch, length, pad_id))


class Encoder(tf.Module):
    """Embedding and N encoder layers (section 3.1); pre-LN adds a final LayerNorm."""

    def __init__(self, c: Config, params: dict[str, np.ndarray], embedding: Embedding):
        super().__init__(name="encoder")
        self.pad_id = c.pad_id
        self.embedding = embedding
        self.layers = [EncoderLayer(c, params, f"encoder.layers.{i}") for i in range(c.n_encoder_layers)]
        self.final_norm = LayerNorm(c, params, "encoder.final_norm") if c.norm_first else None

    def __call__(self, src: tf.Tensor, dropout: Dropout | None = None) -> tf.Tensor:
        """src (B, S) int32 -> memory (B, S, D); keys at ``pad_id`` are masked out. ``dropout`` in training (section
        5.4), None in evaluation."""
        mask = (src != self.pad_id)[:, None, None, :]                         # (B, 1, 1, S) key padding mask
        x = record("src_embed", self.embedding(src, dropout=dropout))         # (B, S, D)
        for i, layer in enumerate(self.layers):
            with scope(f"encoder.layers.{i}"):
                x = record("out", layer(x, mask, dropout))
        if self.final_norm is not None:
            x = self.final_norm(x)
        return record("encoder.out", x)


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
        zeros = lambda d: tf.zeros([B, c.n_heads, capacity, d], memory.dtype)  # noqa: E731
        return KVCache(self_kv=tuple((zeros(c.d_k), zeros(c.d_v)) for _ in self.layers),
                       key_mask=tf.zeros([B, capacity], tf.bool),
                       memory_kv=tuple(layer.cross_attn.key_value(memory) for layer in self.layers),
                       memory_mask=src != c.pad_id, length=tf.constant(0, tf.int32))

    def __call__(self, tokens: tf.Tensor, cache: KVCache, dropout: Dropout | None = None
                 ) -> tuple[tf.Tensor, KVCache]:
        """tokens (B, n) int32 at positions ``cache.length...`` -> float32 logits (B, n, V) and the updated cache.

        Self-attention sees the cached positions and the new ones causally, minus padding keys. ``dropout`` in
        training (section 5.4), None in evaluation.
        """
        start, n, capacity = cache.length, tf.shape(tokens)[1], tf.shape(cache.key_mask)[1]
        key_mask = write_kv(cache.key_mask, tokens != self.c.pad_id, start)                  # (B, T_max)
        causal = tf.range(capacity)[None, :] <= (start + tf.range(n))[:, None]                 # (n, T_max)
        self_mask = causal[None, None] & key_mask[:, None, None, :]                           # (B, 1, n, T_max)
        memory_mask = cache.memory_mask[:, None, None, :]                                     # (B, 1, 1, S)
        y = record("tgt_embed", self.embedding(tokens, start, dropout))                       # (B, n, D)
        self_kv = []
        for i, layer in enumerate(self.layers):
            with scope(f"decoder.layers.{i}"):
                y, kv = layer(y, cache.self_kv[i], start, self_mask, cache.memory_kv[i], memory_mask, dropout)
                record("out", y)
            self_kv.append(kv)
        if self.final_norm is not None:
            y = self.final_norm(y)
        logits = record("logits", self.embedding.logits(record("decoder.out", y)))             # (B, n, V) fp32
        return logits, cache._replace(self_kv=tuple(self_kv), key_mask=key_mask, length=start + n)


class Transformer(tf.Module):
    """The Transformer of "Attention Is All You Need" (section 3), holding ``spec.init_params(config, seed)``.

    ``impl_tf.from_params(config, params)`` builds one from given canonical parameters, ``impl_tf.load_weights``
    from a file. Its entry points always compute in evaluation mode (no dropout); ``impl_tf.train_step`` runs
    the same forward with dropout (section 5.4).

    Args:
        config: a ``spec.config.Config``; ``model.config`` is the config the model computes by.
        seed: a non-negative int. The weights come from ``spec.init_params`` (NumPy, no TensorFlow RNG), so the
            same seed gives bit-identical weights in every backend.

    Raises:
        ValueError: from ``spec.init_params`` if ``seed`` is not a non-negative int.
    """

    def __init__(self, config: Config, seed: int = 0):
        super().__init__(name="transformer")
        self._build(config, init_params(config, seed))

    @classmethod
    def _of(cls, config: Config, params: dict[str, np.ndarray]) -> Transformer:
        """A model holding canonical ``params`` that ``spec.weights_io.check_params`` accepted for ``config``."""
        model = cls.__new__(cls)
        tf.Module.__init__(model, name="transformer")
        model._build(config, params)
        return model

    def _build(self, config: Config, params: dict[str, np.ndarray]) -> None:
        self.config = config
        self.embedding = Embedding(config, params)
        self.encoder = Encoder(config, params, self.embedding)
        self.decoder = Decoder(config, params, self.embedding)
        self._loops = {}  # compiled searches and training steps by str key (_compiled; impl_tf.generate, .train)
        self._shapes = set()  # (function, shape) pairs dispatched so far: XLA compiled each once
        compile_ = functools.partial(tf.function, jit_compile=True)
        self._encode = compile_(lambda src: self.encoder(src), input_signature=[IDS])
        self._forward = compile_(self._teacher_forced, input_signature=[IDS, IDS])
        self._forward_rec = compile_(self._teacher_forced_recorded, input_signature=[IDS, IDS])
        self._decode = compile_(lambda tokens, cache: self.decoder(tokens, cache),
                                input_signature=[IDS, self._cache_spec()])

    def _cache_spec(self) -> KVCache:
        """Shape-polymorphic signature of a KVCache: one trace serves every batch size and capacity."""
        c, act = self.config, self.embedding.dtype
        kv = ((tf.TensorSpec([None, c.n_heads, None, c.d_k], act), tf.TensorSpec([None, c.n_heads, None, c.d_v], act)),
              ) * c.n_decoder_layers
        return KVCache(self_kv=kv, key_mask=tf.TensorSpec([None, None], tf.bool), memory_kv=kv,
                       memory_mask=tf.TensorSpec([None, None], tf.bool), length=tf.TensorSpec([], tf.int32))

    def _compiling(self, function: str, shape: tuple[int, ...], detail: str) -> None:
        """Log, once per model, each new concrete shape given to a compiled function: XLA compiles it then."""
        if (function, shape) not in self._shapes:
            self._shapes.add((function, shape))
            logger.info("impl_tf: compiling %s for %s", function, detail)

    def _compiled(self, key: str, fn, signature=None) -> tf.types.experimental.PolymorphicFunction:
        """``fn`` bound to this model, XLA-compiled once per str ``key`` (traced once per ``signature``, or per
        shape without one). A str: ``tf.Module`` sorts the table's keys when it lists the variables."""
        if key not in self._loops:
            self._loops[key] = tf.function(functools.partial(fn, self), input_signature=signature, jit_compile=True)
        return self._loops[key]

    def parameters(self) -> dict[str, tf.Variable]:
        """Canonical parameter name -> tf.Variable (the shared embedding once), in ``spec.schema`` order."""
        by_name = {v.name.removesuffix(":0"): v for v in self.variables}
        return {s.name: by_name[s.name] for s in param_specs(self.config)}

    def _teacher_forced(self, src: tf.Tensor, tgt_in: tf.Tensor, dropout: Dropout | None = None) -> tf.Tensor:
        """src (B, S), tgt_in (B, T) int32 -> logits (B, T, V) float32: the decoder's one code path over an empty
        cache of capacity T. ``dropout`` in training, None in evaluation."""
        memory = self.encoder(src, dropout)                                                  # (B, S, D)
        return self.decoder(tgt_in, self.decoder.init_cache(memory, src, tf.shape(tgt_in)[1]), dropout)[0]

    def _teacher_forced_recorded(self, src: tf.Tensor, tgt_in: tf.Tensor) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        # Records while tf.function traces this (the plain, uncompiled modules run inside): the dict of symbolic
        # tensors is part of the traced function's output, so every later call returns their values.
        with recording() as rec:
            logits = self._teacher_forced(src, tgt_in)
        return logits, rec

    def __call__(self, src, tgt_in, intermediates: bool = False
                 ) -> Float[tf.Tensor, "B T V"] | tuple[Float[tf.Tensor, "B T V"], dict[str, tf.Tensor]]:
        """Teacher-forced forward (section 3): src (B, S), tgt_in (B, T) int -> logits (B, T, V) float32.

        Token ids may be nested lists, NumPy arrays or tensors. With ``intermediates=True`` returns
        ``(logits, {name: tensor})`` with the tensors of ``spec.shapes.intermediates`` (activations in the
        config's dtype). Runs padded to buckets (module docstring); the results are sliced to B, S and T.

        Raises:
            ValueError: from ``spec.validate.check_forward``, before any computation.
        """
        src, tgt_in = np.asarray(src), np.asarray(tgt_in)
        c = self.config
        validate.check_forward(src, tgt_in, c)
        (B, S), T = src.shape, tgt_in.shape[1]
        size = (shapes.batch_bucket(B), shapes.length_bucket(S, c.max_len), shapes.length_bucket(T, c.max_len))
        function = "forward with intermediates" if intermediates else "forward"
        self._compiling(function, size, f"batch {size[0]}, source length {size[1]}, target length {size[2]} (buckets)")
        src, tgt_in = pad_ids(src, *size[:2], c.pad_id), pad_ids(tgt_in, size[0], size[2], c.pad_id)
        if not intermediates:
            return self._forward(src, tgt_in)[:B, :T]
        logits, rec = self._forward_rec(src, tgt_in)
        want = shapes.intermediates(c, B, S, T)  # name -> ((B, S or T, ...), dtype)
        return logits[:B, :T], {name: x[:B, :want[name][0][1]] for name, x in rec.items()}

    def encode(self, src) -> Float[tf.Tensor, "B S D"]:
        """Encoder stack (section 3.1): src (B, S) int -> memory (B, S, D) in the config's dtype.

        Runs padded to buckets (module docstring); the result is sliced to B and S.

        Raises:
            ValueError: from ``spec.validate.check_source``, before any computation.
        """
        src, c = np.asarray(src), self.config
        validate.check_source(src, c)
        (B, S), size = src.shape, (shapes.batch_bucket(src.shape[0]), shapes.length_bucket(src.shape[1], c.max_len))
        self._compiling("encode", size, f"batch {size[0]}, source length {size[1]} (buckets)")
        return self._encode(pad_ids(src, *size, c.pad_id))[:B, :S]

    def init_cache(self, memory: Float[tf.Tensor, "B S D"], src, capacity: int) -> KVCache:
        """An empty ``KVCache`` for ``capacity`` target positions (P); the cross-attention K/V of memory (B, S, D)
        are computed once here (section 3.2.3).

        Raises:
            ValueError: from ``spec.validate.check_source`` and ``check_capacity`` (an int in [1, max_len]),
                or if memory is not (B, S, D) for src (B, S).
        """
        src = np.asarray(src)
        validate.check_source(src, self.config)
        validate.check_capacity(capacity, self.config)
        if tuple(memory.shape) != (*src.shape, self.config.d_model):
            raise ValueError(f"memory shape {tuple(memory.shape)} does not match src shape {src.shape} "
                             f"and d_model {self.config.d_model}")
        return self.decoder.init_cache(tf.convert_to_tensor(memory), as_ids(src), int(capacity))

    def decode(self, tokens, cache: KVCache) -> tuple[Float[tf.Tensor, "B n V"], KVCache]:
        """n new target tokens (B, n) int at positions ``cache.length``.. -> (logits (B, n, V) float32, cache).

        The cache passed in is consumed: go on with the returned one. A step costs the work of n tokens:
        projections and FFN run on the new tokens only; attention reads the cache (section 3.2.3).

        Raises:
            ValueError: from ``spec.validate.check_decode``: bad ids, a batch that differs from the cache's, or
                no room in the cache for n more positions.
        """
        tokens = np.asarray(tokens)
        B, capacity = cache.key_mask.shape
        validate.check_decode(tokens, self.config, B, int(cache.length), capacity)
        S = cache.memory_mask.shape[1]
        self._compiling("decode", (B, tokens.shape[1], capacity, S),
                        f"batch {B}, steps of {tokens.shape[1]} tokens, capacity {capacity}, source length {S}")
        return self._decode(as_ids(tokens), cache)
