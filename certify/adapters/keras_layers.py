"""Keras 3's stock layers holding the canonical weights, one layer at a time (``run_layer``), as the bench's Keras
peer builds its blocks: ``keras.layers.MultiHeadAttention`` (its kernels are laid out as the spec's: query and key
(D, H, K), value (D, H, C), output (H, C, D), so any d_k and d_v load), ``keras.ops.dot_product_attention``,
``keras.layers.LayerNormalization`` of ``x + y`` and two ``keras.layers.Dense`` with the activation between them.
bf16 as a Keras user asks for it: the layers built with ``dtype="bfloat16"`` (the "bfloat16" dtype policy:
variables and computation in bf16). The backend Keras runs on (``KERAS_BACKEND``) is named in the report.

Not supported: the whole model (keras has no stock encoder-decoder Transformer; keras_hub's layers are not mapped
here), the embedding and output projection (user code in Keras), and everything but layers."""

from __future__ import annotations

from pathlib import Path

import keras
import ml_dtypes
import numpy as np

from certify.adapters import common
from conformance.adapters.base import NotSupported
from spec.config import Config
from spec.weights_io import load_weights

ACTIVATIONS = {"relu": "relu", "gelu": keras.activations.gelu, "silu": "silu",
               "gelu_tanh": lambda x: keras.activations.gelu(x, approximate=True)}
LAYERS = ("scaled_dot_product_attention", "multi_head_attention", "add_norm", "feed_forward")


def _host(x, dtype: str) -> np.ndarray:
    a = np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(x, "float32")))
    return a.astype(ml_dtypes.bfloat16) if "bfloat16" in str(x.dtype) else a


def _set(layer, params: dict[str, np.ndarray], names: list[str]) -> None:
    layer.set_weights([np.asarray(params[n], np.float32) for n in names])


class Model(common.Unsupported):
    why = "Keras has no stock Transformer model; only its layers are mapped"

    def __init__(self, config: Config, params: dict[str, np.ndarray]):
        self.config, self.params, self.dtype = config, params, config.dtype

    def run_layer(self, layer, prefix, inputs):
        if layer not in LAYERS:
            raise NotSupported(f"{layer}: the adapter maps only Keras' stock {', '.join(LAYERS)}")
        c, p, i, dt = self.config, self.params, inputs, self.dtype
        x = {k: v if v.dtype == bool else keras.ops.cast(np.asarray(v, np.float32), dt) for k, v in i.items()}
        if layer == "scaled_dot_product_attention":  # (B, T, H, K) as the spec's; mask True: may attend
            return {"out": _host(keras.ops.dot_product_attention(x["q"], x["k"], x["v"], mask=x["mask"]), dt)}
        if layer == "multi_head_attention":
            mha = keras.layers.MultiHeadAttention(c.n_heads, c.d_k, c.d_v, use_bias=c.attention_bias,
                                                  output_shape=c.d_model, dtype=dt)
            mha(x["x_q"], x["x_kv"])                                                      # builds the weights
            names = [f"{prefix}.{w}_{n}" for n in "qkvo" for w in ("w", "b")[:1 + c.attention_bias]]
            _set(mha, p, names)
            return {"out": _host(mha(x["x_q"], x["x_kv"], attention_mask=x["mask"][:, 0]), dt)}
        if layer == "add_norm":
            norm = keras.layers.LayerNormalization(epsilon=c.layer_norm_eps, dtype=dt)
            norm.build((None, c.d_model))
            _set(norm, p, [f"{prefix}.scale", f"{prefix}.bias"])
            return {"out": _host(norm(x["x"] + x["y"]), dt)}
        dense1 = keras.layers.Dense(c.d_ff, activation=ACTIVATIONS[c.activation], dtype=dt)
        dense2 = keras.layers.Dense(c.d_model, dtype=dt)
        dense1.build((None, c.d_model))
        dense2.build((None, c.d_ff))
        _set(dense1, p, [f"{prefix}.w_1", f"{prefix}.b_1"])
        _set(dense2, p, [f"{prefix}.w_2", f"{prefix}.b_2"])
        return {"out": _host(dense2(dense1(x["x"])), dt)}


class Backend:
    name = "keras.layers"
    supports = frozenset({"encoder_decoder", "decoder_only", "float32", "bfloat16", "layers"})

    def load(self, path: Path) -> Model:
        return Model(*load_weights(path))

    def describe(self) -> str:
        return (f"keras {keras.__version__} layers on {keras.backend.backend()} (bf16 by dtype='bfloat16'), "
                f"one layer at a time")

    sample = staticmethod(common.no_sampling)


def make_backend() -> Backend:
    return Backend()
