"""The JAX backend (``impl_jax``) behind the adapter protocol (``conformance.adapters.base``).

A thin translation over ``impl_jax``'s public API (``spec.api``): ``load_weights``,
``model(...)``, ``model.encode``, ``model.init_cache``, ``model.decode``,
``greedy_search``, ``beam_search``, ``save_weights``; and the modules of ``impl_jax.layers``, built from
the model's canonical parameters (``impl_jax.params_of``) under a layer's name, to run one layer alone.
fp32 products are pinned to true fp32 (``jax_default_matmul_precision``), so fp32
checks never run as TF32 or bf16 passes on an accelerator, and GPU reductions are
made deterministic (``--xla_gpu_deterministic_ops``, read when JAX starts its
backend; a no-op on CPU). Those are the test harness's process-wide choices, not
the library's.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS"), "--xla_gpu_deterministic_ops=true"]))

import jax  # noqa: E402  (after XLA_FLAGS)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import impl_jax  # noqa: E402
from conformance.adapters.base import train_through_api  # noqa: E402
from impl_jax import layers  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def _np(x) -> np.ndarray:
    """A device array as NumPy (bf16 as ``ml_dtypes.bfloat16``)."""
    return np.asarray(jax.device_get(x))


class JaxModel:
    def __init__(self, model: impl_jax.Transformer):
        self.model = model
        self.config = model.config
        self.params = {k: jnp.asarray(x).astype(model.config.dtype) for k, x in impl_jax.params_of(model).items()}

    def forward(self, src, tgt_in, intermediates=False):
        if not intermediates:
            return _np(self.model(src, tgt_in)), {}
        logits, inter = self.model(src, tgt_in, intermediates=True)
        return _np(logits), {k: _np(v) for k, v in inter.items()}

    def encode(self, src):
        return _np(self.model.encode(src))

    def decode_steps(self, src, tgt_in, chunks=None, capacity=None):
        T = np.shape(tgt_in)[1]
        cache = self.model.init_cache(self.model.encode(src), src, capacity=T if capacity is None else capacity)
        steps, start = [], 0
        for n in chunks if chunks is not None else [1] * T:
            logits, cache = self.model.decode(np.asarray(tgt_in)[:, start:start + n], cache)
            steps.append(logits)
            start += n
        return _np(jnp.concatenate(steps, axis=1))

    def greedy(self, src, max_new_tokens=None):
        return impl_jax.greedy_search(self.model, src, max_new_tokens)

    def beam(self, src, beam_size=4, alpha=0.6, max_new_tokens=None):
        return impl_jax.beam_search(self.model, src, beam_size, alpha, max_new_tokens)

    def run_layer(self, layer, prefix, inputs):
        return {k: _np(v) for k, v in _layer_fn(layer, prefix, self.config)(self.params, **inputs).items()}

    def save(self, path: Path) -> None:
        impl_jax.save_weights(self.model, path)

    def train(self, batches, train_config, record_after):
        return train_through_api(impl_jax, self.model, batches, train_config, record_after, _np)  # immutable model


@functools.cache
def _layer_fn(layer, prefix, c):
    """One layer of ``spec.shapes.LAYERS`` as a jitted function of (canonical parameters in ``c.dtype``, inputs), the
    layer's module built from the parameters under ``prefix``."""
    dt = c.dtype

    def decoder_layer(p, y, memory, self_mask, memory_mask):
        B, T = y.shape[:2]
        empty = (jnp.zeros((B, c.n_heads, T, c.d_k), dt), jnp.zeros((B, c.n_heads, T, c.d_v), dt))
        module = layers.DecoderLayer(p, prefix, c)
        out, _ = module(y, empty, self_mask, module.cross_attn.project_kv(memory), memory_mask, 0)
        return {"out": out}

    def multi_head_attention(p, x_q, x_kv, mask):
        module = layers.MultiHeadAttention(p, prefix)
        return {"out": module(x_q, module.project_kv(x_kv), mask)}

    fns = {
        "positional_encoding": lambda p: {"pe": layers.positional_encoding(c.max_len, c.d_model)},
        "embedding": lambda p, ids: {"x": layers.Embedder(p, c).encode(ids)},
        "scaled_dot_product_attention": lambda p, q, k, v, mask: {  # k, v (B, S, H, .) -> heads-major
            "out": layers.scaled_dot_product_attention(q, k.swapaxes(1, 2), v.swapaxes(1, 2), mask)},
        "multi_head_attention": multi_head_attention,
        "add_norm": lambda p, x, y: {"out": layers.LayerNorm(p, prefix, c.layer_norm_eps)(x + y)},
        "feed_forward": lambda p, x: {"out": layers.FeedForward(p, prefix)(x)},
        "encoder_layer": lambda p, x, mask: {"out": layers.EncoderLayer(p, prefix, c)(x, mask)},
        "decoder_layer": decoder_layer,
        "output_projection": lambda p, h: {"logits": layers.Embedder(p, c).decode(h)},
    }
    return jax.jit(fns[layer])


class JaxBackend:
    name = "jax"
    module = impl_jax

    def load(self, path: Path) -> JaxModel:
        return JaxModel(impl_jax.load_weights(path))

    def describe(self) -> str:
        d = jax.devices()[0]
        return f"JAX {jax.__version__}, {d.platform.upper()} ({d.device_kind})"


def make_backend() -> JaxBackend:
    return JaxBackend()
