"""The TensorFlow backend (``impl_tf``) behind the adapter protocol (``conformance.adapters.base``).

A thin translation over ``impl_tf``'s public API (``spec.api``): ``load_weights``, ``model(...)``,
``model.encode``, ``model.init_cache``, ``model.decode``, ``greedy_search``, ``beam_search``, ``save_weights``;
and the model's layers (``tf.Module``s named by canonical prefix) to run one layer alone. NumPy in, NumPy out.
TF32 off (fp32 products stay fp32 on GPUs, ``spec.numerics`` rule 8) and op determinism on are the test
harness's process-wide choices, not the library's.
"""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import tensorflow as tf

import impl_tf
from conformance.adapters.base import train_through_api
from impl_tf.layers import residual_add
from spec.config import Config

# fp32 products must be fp32 on GPUs too (spec.numerics rule 8); op determinism keeps runs repeatable.
tf.config.experimental.enable_tensor_float_32_execution(False)
tf.config.experimental.enable_op_determinism()


def _tensor(x: np.ndarray) -> tf.Tensor:
    """A layer input: masks stay bool, activations keep their dtype (bf16 via ml_dtypes)."""
    return tf.constant(x)


def _module(model: impl_tf.Transformer, prefix: str):
    """The layer at a canonical prefix: "decoder.layers.1.cross_attn" -> model.decoder.layers[1].cross_attn."""
    obj = model
    for part in prefix.split("."):
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj


class TFModel:
    def __init__(self, model: impl_tf.Transformer):
        self.model = model
        self.config: Config = model.config

    def forward(self, src, tgt_in, intermediates=False):
        if not intermediates:
            return self.model(src, tgt_in).numpy(), {}
        logits, rec = self.model(src, tgt_in, intermediates=True)
        return logits.numpy(), {name: x.numpy() for name, x in rec.items()}

    def encode(self, src):
        return self.model.encode(src).numpy()

    def decode_steps(self, src, tgt_in, chunks=None, capacity=None):
        T = np.shape(tgt_in)[1]
        cache = self.model.init_cache(self.model.encode(src), src, T if capacity is None else capacity)
        steps, start = [], 0
        for n in chunks if chunks is not None else [1] * T:
            logits, cache = self.model.decode(np.asarray(tgt_in)[:, start:start + n], cache)
            steps.append(logits.numpy())
            start += n
        return np.concatenate(steps, axis=1)

    def greedy(self, src, max_new_tokens=None):
        return impl_tf.greedy_search(self.model, src, max_new_tokens).numpy()

    def beam(self, src, beam_size=4, alpha=0.6, max_new_tokens=None):
        return impl_tf.beam_search(self.model, src, beam_size, alpha, max_new_tokens).numpy()

    def run_layer(self, layer, prefix, inputs):
        i = {k: _tensor(v) for k, v in inputs.items()}
        m = self.model
        if layer == "positional_encoding":
            return {"pe": impl_tf.positional_encoding(self.config.max_len, self.config.d_model).numpy()}
        if layer == "embedding":
            return {"x": m.embedder.encode(tf.cast(i["ids"], tf.int32)).numpy()}
        if layer == "scaled_dot_product_attention":
            k, v = (tf.transpose(i[n], [0, 2, 1, 3]) for n in ("k", "v"))  # heads-major, as the KV cache holds them
            return {"out": impl_tf.scaled_dot_product_attention(i["q"], k, v, i["mask"]).numpy()}
        if layer == "multi_head_attention":
            attn = _module(m, prefix)
            return {"out": attn.forward(i["x_q"], attn.project_kv(i["x_kv"]), i["mask"]).numpy()}
        if layer == "add_norm":  # the paper's post-LN LayerNorm(x + y) with the norm at prefix
            return {"out": _module(m, prefix).forward(residual_add(i["x"], i["y"])).numpy()}
        if layer == "feed_forward":
            return {"out": _module(m, prefix).forward(i["x"]).numpy()}
        if layer == "encoder_layer":
            return {"out": _module(m, prefix).forward(i["x"], i["mask"]).numpy()}
        if layer == "decoder_layer":
            return {"out": self._decoder_layer(_module(m, prefix), i)}
        if layer == "output_projection":
            return {"logits": m.embedder.decode(i["h"]).numpy()}
        raise ValueError(f"unknown layer {layer!r}")

    def _decoder_layer(self, layer: impl_tf.DecoderLayer, i: dict[str, tf.Tensor]) -> np.ndarray:
        """One decoder layer over T tokens from an empty cache of capacity T, with the given masks."""
        y, c = i["y"], self.config
        B, T = y.shape[0], y.shape[1]
        empty = (tf.zeros([B, c.n_heads, T, c.d_k], y.dtype), tf.zeros([B, c.n_heads, T, c.d_v], y.dtype))
        out, _ = layer.forward(y, empty, i["self_mask"], layer.cross_attn.project_kv(i["memory"]), i["memory_mask"], 0)
        return out.numpy()

    def save(self, path: Path) -> None:
        impl_tf.save_weights(self.model, path)

    def train(self, batches, train_config, record_after):
        model = impl_tf.from_params(self.config, impl_tf.params_of(self.model))  # a copy: train_step updates it
        return train_through_api(impl_tf, model, batches, train_config, record_after, lambda t: t.numpy())


class TFBackend:
    name = "tf"
    module = impl_tf

    def load(self, path: Path) -> TFModel:
        return TFModel(impl_tf.load_weights(path))

    def describe(self) -> str:
        devices = ", ".join(d.device_type for d in tf.config.list_logical_devices()) or "none"
        return f"TensorFlow {tf.__version__} (XLA jit_compile), devices: {devices}, {platform.machine()}"


def make_backend() -> TFBackend:
    return TFBackend()
