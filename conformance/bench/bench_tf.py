"""TensorFlow's subjects for ``conformance.bench.run``: ``impl_tf`` and a stock Keras 3 Transformer.

Every subject synchronises before it returns: a result is brought to the host with ``.numpy()``
(``tf.test.experimental.sync_devices()`` for the matmul, whose result stays on the device).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # the peer is Keras on TensorFlow, whatever keras.json says
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import impl_tf  # noqa: E402
from conformance.bench.common import clock  # noqa: E402
from spec.config import Config  # noqa: E402


def setup(device: str) -> dict:
    """Process settings for the bench (TF32 off, the GPU hidden for ``device="cpu"``) and the environment to
    record: TensorFlow and Keras versions, the device name (GPU name and CUDA/cuDNN versions on a GPU)."""
    env = {"tensorflow": tf.__version__, "keras": keras.__version__, "keras_backend": keras.backend.backend()}
    gpus = tf.config.list_physical_devices("GPU")
    if device == "cpu":
        if gpus:
            tf.config.set_visible_devices([], "GPU")
        env["device_name"] = "CPU"
        return env
    if not gpus:
        raise RuntimeError("--device cuda: TensorFlow sees no GPU (tensorflow-cpu, or no CUDA build)")
    tf.config.experimental.enable_tensor_float_32_execution(False)
    build = tf.sysconfig.get_build_info()
    env.update(device_name=tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU"),
               cuda=build.get("cuda_version"), cudnn=build.get("cudnn_version"))
    return env


def matmul(dtype: str, device: str, M: int, K: int, N: int) -> Callable[[], None]:
    """One (M, K) x (K, N) ``tf.matmul`` in ``dtype`` operands (and result), compiled by XLA."""
    rng = np.random.default_rng(0)
    a = tf.constant(rng.standard_normal((M, K), np.float32), tf.dtypes.as_dtype(dtype))  # (M, K)
    b = tf.constant(rng.standard_normal((K, N), np.float32), tf.dtypes.as_dtype(dtype))  # (K, N)
    product = tf.function(tf.matmul, jit_compile=True)

    def run() -> None:
        product(a, b)                                                                    # (M, N)
        tf.test.experimental.sync_devices()

    return run


class Ours:
    """``impl_tf`` through its public API (``spec.api``); see ``conformance.bench.common.Generator``."""

    def __init__(self, config: Config, params: dict[str, np.ndarray]):
        self.model = impl_tf.from_params(config, params)
        self.name, self.dtype, self.config = "impl_tf", config.dtype, config

    def forward(self, src: np.ndarray, tgt_in: np.ndarray) -> None:
        self.model(src, tgt_in).numpy()                                                  # (B, T, V) float32

    def greedy(self, src: np.ndarray, max_new_tokens: int) -> np.ndarray:
        return impl_tf.greedy_search(self.model, src, max_new_tokens).numpy()           # (B, L) int64

    def beam(self, src: np.ndarray, max_new_tokens: int, beam_size: int) -> np.ndarray:
        return impl_tf.beam_search(self.model, src, beam_size, 0.6, max_new_tokens).numpy()  # (B, L) int64

    def cached_steps(self, src: np.ndarray, n: int) -> list[float]:
        cache = self.model.init_cache(self.model.encode(src), src, n)
        tokens = np.full((len(src), 1), self.config.bos_id)                              # (B, 1)
        seconds = []
        for _ in range(n):
            start = clock()
            logits, cache = self.model.decode(tokens, cache)                             # (B, 1, V)
            tokens = tf.argmax(logits[:, -1], axis=-1).numpy()[:, None]                  # (B, 1)
            seconds.append(clock() - start)
        return seconds

    def recomputed_steps(self, src: np.ndarray, n: int) -> list[float]:
        prefix = np.full((len(src), 1), self.config.bos_id)                              # (B, t)
        seconds = []
        for _ in range(n):
            start = clock()
            logits = self.model(src, prefix)                                             # (B, t, V)
            best = tf.argmax(logits[:, -1], axis=-1).numpy()                             # (B,)
            prefix = np.concatenate([prefix, best[:, None]], axis=1)
            seconds.append(clock() - start)
        return seconds


def ours(config: Config, params: dict[str, np.ndarray], device: str) -> Ours:
    """Our impl holding ``params``, in ``config.dtype``."""
    return Ours(config, params)


class _KerasTransformer(keras.Model):
    """The paper's post-LN encoder-decoder from stock Keras layers: a shared ``Embedding`` (times sqrt(D), plus
    the sinusoidal PE), ``MultiHeadAttention`` (no biases, as the paper), ``Dense`` FFN, ``LayerNormalization``,
    dropout off, and the output projection tied to the embedding. ``policy`` is each layer's dtype policy."""

    def __init__(self, c: Config, policy: str):
        super().__init__(dtype=policy, name="transformer")
        layer = dict(dtype=policy)
        D = c.d_model
        self.embedding = keras.layers.Embedding(c.vocab_size, D, **layer)
        self.pe = impl_tf.positional_encoding(c.max_len, D)                              # (max_len, D) fp32
        self.scale = math.sqrt(D)

        def attention():
            return keras.layers.MultiHeadAttention(c.n_heads, c.d_k, value_dim=c.d_v, use_bias=False, **layer)

        def ffn():
            return [keras.layers.Dense(c.d_ff, activation="relu", **layer), keras.layers.Dense(D, **layer)]

        def norm():
            return keras.layers.LayerNormalization(epsilon=c.layer_norm_eps, **layer)

        self.encoder = [dict(attn=attention(), attn_norm=norm(), ffn=ffn(), ffn_norm=norm())
                        for _ in range(c.n_encoder_layers)]
        self.decoder = [dict(attn=attention(), attn_norm=norm(), cross=attention(), cross_norm=norm(), ffn=ffn(),
                             ffn_norm=norm()) for _ in range(c.n_decoder_layers)]

    def embed(self, ids: tf.Tensor) -> tf.Tensor:
        """ids (B, L) -> (B, L, D) in the compute dtype."""
        x = self.embedding(ids) * self.scale
        return x + tf.cast(self.pe[:tf.shape(ids)[1]], x.dtype)

    def call(self, src: tf.Tensor, tgt_in: tf.Tensor) -> tf.Tensor:
        """src (B, S), tgt_in (B, T) int32 -> logits (B, T, V) float32."""
        x = self.embed(src)                                                              # (B, S, D)
        for lay in self.encoder:
            x = lay["attn_norm"](x + lay["attn"](x, x))
            x = lay["ffn_norm"](x + lay["ffn"][1](lay["ffn"][0](x)))
        memory, y = x, self.embed(tgt_in)                                                # (B, S, D), (B, T, D)
        for lay in self.decoder:
            y = lay["attn_norm"](y + lay["attn"](y, y, use_causal_mask=True))
            y = lay["cross_norm"](y + lay["cross"](y, memory))
            y = lay["ffn_norm"](y + lay["ffn"][1](lay["ffn"][0](y)))
        table = tf.cast(self.embedding.embeddings, y.dtype)                              # (V, D)
        return tf.cast(tf.matmul(y, table, transpose_b=True), tf.float32)                # (B, T, V)


class Peer:
    """The stock Keras model, its call wrapped in ``tf.function(jit_compile=True)``: XLA compiles it."""

    def __init__(self, config: Config):
        policy = "mixed_bfloat16" if config.dtype == "bfloat16" else "float32"
        self.name, self.dtype = "keras.layers", config.dtype
        self.model = _KerasTransformer(config, policy)
        self.model(tf.ones([1, 1], tf.int32), tf.ones([1, 1], tf.int32))  # builds the layers' variables eagerly
        self.call = tf.function(lambda src, tgt_in: self.model(src, tgt_in), jit_compile=True)

    def forward(self, src: np.ndarray, tgt_in: np.ndarray) -> None:
        self.call(tf.constant(src, tf.int32), tf.constant(tgt_in, tf.int32)).numpy()    # (B, T, V) float32


def peer(config: Config, device: str) -> Peer:
    """Keras 3 (on TensorFlow) stock layers at ``config``'s hyperparameters, in ``config.dtype``: bf16 as Keras
    mixed precision per layer (``dtype="mixed_bfloat16"``, fp32 variables, bf16 compute; the global policy
    untouched), fp32 as fp32. Keras' own initialisation."""
    return Peer(config)
