"""The TensorFlow subjects of the decoder-only workloads (``bench.lm_run``): ``impl_tf.LanguageModel`` and
``keras_hub``'s GPT-2 (``GPT2Backbone`` in a ``GPT2CausalLM``, no preprocessor) on the TensorFlow backend, built at
the same sizes, random weights.

A subject returns once its result is on the host (``.numpy()``).
"""

from __future__ import annotations

import os

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # the peer is Keras on TensorFlow, whatever keras.json says
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import impl_tf  # noqa: E402
from bench.common import clock  # noqa: E402
from spec.config import Config  # noqa: E402


class Ours:
    """``impl_tf.from_params`` through the public API: ``init_cache``/``decode`` and ``generate``."""

    name = "impl_tf"

    def __init__(self, config: Config, params: dict[str, np.ndarray]):
        self.model, self.dtype = impl_tf.from_params(config, params), config.dtype

    def prefill(self, prompt: np.ndarray) -> None:
        cache = self.model.init_cache(len(prompt), prompt.shape[1])
        self.model.decode(prompt, cache)[0].numpy()                                      # (B, L, V) fp32

    def decode_steps(self, prompt: np.ndarray, n: int, capacity: int) -> list[float]:
        logits, cache = self.model.decode(prompt, self.model.init_cache(len(prompt), capacity))
        tokens, times = tf.argmax(logits[:, -1:], axis=-1).numpy(), []                   # (B, 1)
        for _ in range(n):
            start = clock()
            logits, cache = self.model.decode(tokens, cache)                             # (B, 1, V)
            tokens = tf.argmax(logits[:, -1:], axis=-1).numpy()                          # (B, 1)
            times.append(clock() - start)
        return times

    def generate(self, prompt: np.ndarray, n: int) -> np.ndarray:
        return np.asarray(impl_tf.generate(self.model, prompt, n, temperature=0.0))      # (B, n)


def ours(config: Config, params: dict[str, np.ndarray], device: str) -> Ours:
    return Ours(config, params)


class Peer:
    """``keras_hub.models.GPT2CausalLM`` as a Keras user builds it from config: GPT-2's layers (learned positions,
    GELU, biases, the tied head), weights and computation in ``dtype`` (``dtype="bfloat16"`` or "float32"), its own
    cache (``call_with_cache``, compiled with ``tf.function(jit_compile=True)`` as its ``generate`` compiles it) and
    its ``generate`` with the greedy sampler, no stop token (every row runs the n steps). XLA compiles its cached
    call once per cache index (the index is a constant of the program), so the decode steps' untimed first round
    compiles every index the timed rounds use."""

    name = "keras_hub.GPT2CausalLM"

    def __init__(self, config: Config):
        import keras_hub

        c = self.config = config
        keras.utils.set_random_seed(0)
        backbone = keras_hub.models.GPT2Backbone(
            vocabulary_size=c.vocab_size, num_layers=c.n_decoder_layers, num_heads=c.n_heads, hidden_dim=c.d_model,
            intermediate_dim=c.d_ff, dropout=0.0, max_sequence_length=c.max_len, dtype=c.dtype)
        self.lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
        self.lm.compile(sampler="greedy")
        self.dtype = c.dtype
        self._call = tf.function(self.lm.call_with_cache, jit_compile=True)

    def _cache(self, B: int, capacity: int) -> tf.Tensor:
        """keras_hub's cache layout: (B, layers, 2 (key, value), capacity, heads, d_model / heads)."""
        c = self.config
        shape = (B, c.n_decoder_layers, 2, capacity, c.n_heads, c.d_model // c.n_heads)
        return tf.zeros(shape, self.lm.compute_dtype)

    def prefill(self, prompt: np.ndarray) -> None:
        B, L = prompt.shape
        self._call(tf.constant(prompt, tf.int32), self._cache(B, L), tf.constant(0))[0].numpy()   # (B, L, V)

    def decode_steps(self, prompt: np.ndarray, n: int, capacity: int) -> list[float]:
        B, L = prompt.shape
        logits, _, cache = self._call(tf.constant(prompt, tf.int32), self._cache(B, capacity), tf.constant(0))
        tokens, times = tf.argmax(logits[:, -1:], axis=-1, output_type=tf.int32).numpy(), []   # (B, 1)
        for i in range(n):
            start = clock()
            logits, _, cache = self._call(tf.constant(tokens), cache, tf.constant(L + i))
            tokens = tf.argmax(logits[:, -1:], axis=-1, output_type=tf.int32).numpy()    # (B, 1)
            times.append(clock() - start)
        return times

    def generate(self, prompt: np.ndarray, n: int) -> np.ndarray:
        """Without a preprocessor keras_hub generates into the positions its padding mask leaves free."""
        B, L = prompt.shape
        ids = np.concatenate([prompt, np.zeros((B, n), prompt.dtype)], axis=1).astype(np.int32)   # (B, L + n)
        mask = np.arange(L + n)[None, :].repeat(B, axis=0) < L                                    # (B, L + n)
        out = self.lm.generate({"token_ids": ids, "padding_mask": mask}, stop_token_ids=None)
        return np.asarray(out["token_ids"])[:, L:]                                                # (B, n)


def peer(config: Config, device: str) -> Peer:
    return Peer(config)
