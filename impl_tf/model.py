"""The encoder-decoder Transformer (Vaswani et al., 2017, section 3) as a tf.Module, with a preallocated KV cache,
and what the decoder-only ``impl_tf.lm.LanguageModel`` shares with it (``decode``): the entry points that check
their inputs. The encoder and decoder stacks, the KV cache and the unchecked computations are ``impl_tf.stacks``';
the programs that run them, ``impl_tf.programs``'.

The entry points run as ``tf.function(jit_compile=True)`` programs with shape-polymorphic input signatures: traced
once, compiled by XLA once per concrete shape, and shared by the models of one config, whose weights they take as
arguments.

So that varying shapes compile a bounded number of programs, the forward, ``encode``, the searches and the
training steps pad their inputs to buckets (``spec.shapes.batch_bucket``, ``length_bucket``; why the padding
changes no real result is written there) and slice the padding off their results. ``init_cache`` and ``decode``
are not padded: their capacity is the caller's choice. Each shape compiled for the first time logs one line at
INFO on the ``"impl_tf"`` logger.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from impl_tf.inputs import device_ids, host_ids
from impl_tf.layers import Embedder
from impl_tf.programs import IDS, compiled, model_fields, run_forward
from impl_tf.stacks import (
    Decoder,
    Encoder,
    KVCache,
    decoder_logits,
    encoder_memory,
    forward_logits,
    source_cache,
)
from spec import shapes, validate
from spec.annotations import Float
from spec.config import Config
from spec.init import init_params


class Transformer(tf.Module):
    """The Transformer of "Attention Is All You Need" (section 3), holding ``spec.init_params(config, seed)``.

    Its entry points compute in evaluation mode (no dropout) unless the forward is given a dropout ``rng`` (section
    5.4), as ``impl_tf.train_step`` gives it one each step. ``params``: canonical parameters that
    ``spec.weights_io.check_params`` accepted for ``config``, held instead of ``init_params``'s
    (``impl_tf.from_params``, ``load_weights``). Fields: ``config``; the layers; those of
    ``impl_tf.programs.model_fields``.

    Raises:
        ValueError: from ``spec.validate.check_model_kind`` for a decoder-only config, or ``spec.init_params``.
    """

    def __init__(self, config: Config, seed: int = 0, *, params: dict[str, np.ndarray] | None = None):
        validate.check_model_kind(config, decoder_only=False)
        super().__init__(name="transformer")
        params = init_params(config, seed) if params is None else params
        self.config = config
        self.embedder = Embedder(config, params)
        self.encoder = Encoder(config, params)
        self.decoder = Decoder(config, params)
        model_fields(self)

    def forward(self, src, tgt_in, intermediates: bool = False, *, rng=None
                ) -> Float[tf.Tensor, "B T V"] | tuple[Float[tf.Tensor, "B T V"], dict[str, tf.Tensor]]:
        """Teacher-forced forward (section 3), as ``spec.api``; token ids may be nested lists, NumPy arrays or
        tensors. Runs padded to buckets (module docstring), so the masks a seed draws for the real positions depend
        on the buckets too. ``rng``: dropout (section 5.4, ``layers.dropout``) from a stateless seed, (2,) int (a
        list, array or tensor, e.g. ``[seed, 0]``), else ``ValueError``; None, the default, evaluates."""
        src, tgt_in = host_ids(src), host_ids(tgt_in, "tgt_in")
        validate.check_forward(src, tgt_in, self.config)
        return run_forward(self, forward_logits, [src, tgt_in], intermediates, rng)

    __call__ = forward

    def encode(self, src) -> Float[tf.Tensor, "B S D"]:
        """Encoder stack (section 3.1): src (B, S) int -> memory (B, S, D); runs padded to buckets."""
        src, c = host_ids(src), self.config
        validate.check_source(src, c)
        (B, S), size = src.shape, (shapes.batch_bucket(src.shape[0]), shapes.length_bucket(src.shape[1], c.max_len))
        encode = compiled(self, "encode", lambda src: encoder_memory(self, src), [IDS], size, dropout=False)
        return encode(device_ids(src, *size, c.pad_id))[:B, :S]

    def init_cache(self, memory: Float[tf.Tensor, "B S D"], src, capacity: int) -> KVCache:
        """An empty ``KVCache`` for ``capacity`` target positions (P); the cross-attention K/V of memory (B, S, D)
        are computed once here (section 3.2.3). Raises ``ValueError`` as ``spec.api``, or for memory not (B, S, D).
        """
        src = host_ids(src)
        validate.check_source(src, self.config)
        validate.check_capacity(capacity, self.config)
        if tuple(memory.shape) != (*src.shape, self.config.d_model):
            raise ValueError(f"memory shape {tuple(memory.shape)} does not match src shape {src.shape} "
                             f"and d_model {self.config.d_model}")
        return source_cache(self, tf.convert_to_tensor(memory), device_ids(src, *src.shape, self.config.pad_id),
                           int(capacity))

    def decode(self, tokens, cache: KVCache) -> tuple[Float[tf.Tensor, "B n V"], KVCache]:
        """n new target tokens (B, n) int at positions ``cache.length``.. -> (logits (B, n, V) float32, cache).
        Projections and FFN run on the new tokens only; attention reads the cache (section 3.2.3)."""
        return decode(self, tokens, cache)


def decode(model: tf.Module, tokens, cache: KVCache) -> tuple[tf.Tensor, KVCache]:
    """The ``decode`` of either model (``Transformer``, ``impl_tf.lm.LanguageModel``): validated, then one program,
    which takes the cache's tensors, a decoder-only model's without memory (a signature holds no None)."""
    tokens, c = host_ids(tokens, "tokens"), model.config
    B, capacity = cache.key_mask.shape
    validate.check_decode(tokens, c, B, int(cache.length), capacity)
    kv = ((tf.TensorSpec([None, c.n_heads, None, c.d_k], model.embedder.dtype),
           tf.TensorSpec([None, c.n_heads, None, c.d_v], model.embedder.dtype)),) * c.n_decoder_layers
    mask, length = tf.TensorSpec([None, None], tf.bool), tf.TensorSpec([], tf.int32)
    memory = () if c.decoder_only else (cache.memory_kv, cache.memory_mask)

    def step(tokens: tf.Tensor, self_kv: tuple, key_mask: tf.Tensor, length: tf.Tensor, memory: tuple):
        return decoder_logits(model, tokens, KVCache(self_kv, key_mask, *(memory or ((), None)), length))

    shape = (B, tokens.shape[1], capacity, *(m.shape[1] for m in memory[1:]))
    program = compiled(model, "decode", step, [IDS, kv, mask, length, (kv, mask)[:len(memory)]], shape,
                       dropout=False)
    return program(device_ids(tokens, *tokens.shape, c.pad_id), cache.self_kv, cache.key_mask, cache.length, memory)

