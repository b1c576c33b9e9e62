"""TensorFlow's subjects for ``bench.run``: ``impl_tf`` and a stock Keras 3 Transformer.

Every subject synchronises before it returns: a result (the peer's training loss too) is brought to the host
with ``.numpy()`` (``tf.test.experimental.sync_devices()`` for the matmul, whose result stays on the device).
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
from bench.common import TRAIN, clock, peer_learning_rate  # noqa: E402
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
    """``impl_tf`` through its public API (``spec.api``); see ``bench.common.Generator``."""

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
    ``Dropout(dropout)`` on the embeddings and each sublayer's output (the paper's places; off by default), and
    the output projection tied to the embedding. ``policy`` is each layer's dtype policy."""

    def __init__(self, c: Config, policy: str, dropout: float = 0.0):
        super().__init__(dtype=policy, name="transformer")
        layer = dict(dtype=policy)
        D = c.d_model
        self.embedding = keras.layers.Embedding(c.vocab_size, D, **layer)
        self.drop = keras.layers.Dropout(dropout, **layer)
        self.pe = impl_tf.layers.positional_encoding(c.max_len, D)                              # (max_len, D) fp32
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

    def embed(self, ids: tf.Tensor, training: bool) -> tf.Tensor:
        """ids (B, L) -> (B, L, D) in the compute dtype."""
        x = self.embedding(ids) * self.scale
        return self.drop(x + tf.cast(self.pe[:tf.shape(ids)[1]], x.dtype), training=training)

    def call(self, src: tf.Tensor, tgt_in: tf.Tensor, training: bool = False) -> tf.Tensor:
        """src (B, S), tgt_in (B, T) int32 -> logits (B, T, V) float32; dropout only when ``training``."""
        def drop(x: tf.Tensor) -> tf.Tensor:
            return self.drop(x, training=training)

        x = self.embed(src, training)                                                    # (B, S, D)
        for lay in self.encoder:
            x = lay["attn_norm"](x + drop(lay["attn"](x, x)))
            x = lay["ffn_norm"](x + drop(lay["ffn"][1](lay["ffn"][0](x))))
        memory, y = x, self.embed(tgt_in, training)                                      # (B, S, D), (B, T, D)
        for lay in self.decoder:
            y = lay["attn_norm"](y + drop(lay["attn"](y, y, use_causal_mask=True)))
            y = lay["cross_norm"](y + drop(lay["cross"](y, memory)))
            y = lay["ffn_norm"](y + drop(lay["ffn"][1](lay["ffn"][0](y))))
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


class PeerTrainer:
    """The peer's training step as the Keras guide to a custom ``train_step`` writes it: the model with dropout
    ``config.dropout`` (bf16: the per-layer "mixed_bfloat16" policy, fp32 variables), under ``tf.GradientTape``
    the forward with ``training=True`` and ``keras.losses.CategoricalCrossentropy(from_logits=True,
    label_smoothing=0.1)`` on the fp32 logits averaged over the non-pad targets, ``keras.optimizers.Adam`` at a
    constant learning rate applying the gradients; the step in ``tf.function(jit_compile=True)``. ``.numpy()`` of
    the loss synchronises."""

    def __init__(self, config: Config):
        policy = "mixed_bfloat16" if config.dtype == "bfloat16" else "float32"
        self.name, self.dtype, self.pad_id, self.V = "keras.layers", config.dtype, config.pad_id, config.vocab_size
        self.model = _KerasTransformer(config, policy, config.dropout)
        self.model(tf.ones([1, 1], tf.int32), tf.ones([1, 1], tf.int32))  # builds the layers' variables eagerly
        self.optimizer = keras.optimizers.Adam(peer_learning_rate(config), beta_1=TRAIN.beta1, beta_2=TRAIN.beta2,
                                               epsilon=TRAIN.adam_eps)
        self.optimizer.build(self.model.trainable_variables)                  # Adam's slots, eagerly too
        self.loss = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=TRAIN.label_smoothing,
                                                         reduction=None)
        self._step = tf.function(self._train_step, jit_compile=True)

    def _train_step(self, src: tf.Tensor, tgt_in: tf.Tensor, tgt_out: tf.Tensor) -> tf.Tensor:
        weights = self.model.trainable_variables
        with tf.GradientTape() as tape:
            logits = self.model(src, tgt_in, training=True)                              # (B, T, V) float32
            per_token = self.loss(tf.one_hot(tgt_out, self.V), logits)                   # (B, T)
            keep = tf.cast(tgt_out != self.pad_id, tf.float32)                           # (B, T)
            loss = tf.reduce_sum(per_token * keep) / tf.reduce_sum(keep)                 # () float32
        self.optimizer.apply_gradients(zip(tape.gradient(loss, weights), weights, strict=True))
        return loss

    def step(self, src: np.ndarray, tgt_in: np.ndarray, tgt_out: np.ndarray) -> None:
        """src (B, S), tgt_in (B, T), tgt_out (B, T): one Adam step."""
        self._step(*(tf.constant(a, tf.int32) for a in (src, tgt_in, tgt_out))).numpy()


def peer_trainer(config: Config, device: str) -> PeerTrainer:
    """The stock peer's own training step in ``config.dtype`` (mixed precision for bf16), fp32 master weights."""
    return PeerTrainer(config)
