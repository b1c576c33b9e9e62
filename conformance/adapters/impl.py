"""One adapter for every impl: the ``Model`` protocol of ``conformance.adapters.base`` over an impl's common API
(``spec.api``) and its skeleton's layers, with what differs between frameworks in a small ``Dialect``.

The layers are reached by the skeleton's names in every impl (``Embedder.encode``/``decode``,
``MultiHeadAttention.project_kv``/``forward``, ``LayerNorm``, ``FeedForward``, ``EncoderLayer``, ``DecoderLayer``,
``positional_encoding``, ``scaled_dot_product_attention`` of ``impl.layers``), each module found in the model at its
canonical prefix ("decoder.layers.1.cross_attn").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from conformance.adapters.base import train_through_api
from spec.config import Config


class Dialect:
    """What one framework does its own way, each a line or two of that framework; the defaults here are what most
    frameworks do, and a backend's dialect overrides the rest."""

    def array(self, x: Any) -> np.ndarray:
        """A framework array as NumPy (bf16 as ``ml_dtypes.bfloat16``)."""
        raise NotImplementedError

    def tensor(self, a: np.ndarray, model: Any) -> Any:
        """A NumPy layer input (ids, masks, activations) as the framework's array, where ``model`` computes."""
        raise NotImplementedError

    def zeros(self, like: Any, shape: tuple[int, ...]) -> Any:
        """Zeros of ``like``'s dtype and device."""
        raise NotImplementedError

    def heads_major(self, x: Any) -> Any:
        """(B, S, H, K) -> (B, H, S, K)."""
        raise NotImplementedError

    def concat(self, xs: Sequence[Any]) -> Any:
        """Concatenation along axis 1."""
        raise NotImplementedError

    def add(self, x: Any, y: Any) -> Any:
        """The residual sum as the impl computes it (``spec.numerics`` rule 5: rounded to the activation dtype)."""
        return x + y

    def rng(self, seed: int, model: Any) -> Any:
        """The impl's dropout RNG (the ``rng=`` of its forward) seeded from ``seed``, where ``model`` computes."""
        raise NotImplementedError

    def evaluating(self) -> contextlib.AbstractContextManager:
        """The context of an evaluation call through the API (torch: no autograd records)."""
        return contextlib.nullcontext()

    def layers_of(self, model: Any) -> Any:
        """The model whose submodules ``run_layer`` calls (jax: its weights rounded to the compute dtype)."""
        return model

    def run(self, key: tuple, fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
        """``fn(*args)`` as the framework runs a layer alone (jax: jitted, cached under ``key``)."""
        return fn(*args)

    def copy(self, impl: ModuleType, model: Any) -> Any:
        """A model with the same weights that training may consume (a copy, as ``train_step`` may update in place)."""
        return impl.from_params(model.config, impl.params_of(model))


def submodule(model: Any, prefix: str) -> Any:
    """The layer at a canonical prefix: "decoder.layers.1.cross_attn" -> model.decoder.layers[1].cross_attn."""
    obj = model
    for part in prefix.split("."):
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj


class ImplModel:
    """``conformance.adapters.base.Model`` over ``impl``'s public API; NumPy in, NumPy out."""

    def __init__(self, impl: ModuleType, model: Any, dialect: Dialect):
        self.impl, self.model, self.d = impl, model, dialect
        self.config: Config = model.config
        self.modules = dialect.layers_of(model)

    def forward(self, src, tgt_in, intermediates=False, dropout_seed=None):
        rng = {} if dropout_seed is None else {"rng": self.d.rng(dropout_seed, self.model)}
        ids = (tgt_in,) if self.config.decoder_only else (src, tgt_in)
        with self.d.evaluating():
            if not intermediates:
                return self.d.array(self.model(*ids, **rng)), {}
            logits, inter = self.model(*ids, intermediates=True, **rng)
            return self.d.array(logits), {k: self.d.array(v) for k, v in inter.items()}

    def encode(self, src):
        with self.d.evaluating():
            return self.d.array(self.model.encode(src))

    def decode_steps(self, src, tgt_in, chunks=None, capacity=None):
        with self.d.evaluating():
            return self._decode_steps(src, tgt_in, chunks, capacity)

    def _decode_steps(self, src, tgt_in, chunks, capacity):
        T = np.shape(tgt_in)[1]
        capacity = T if capacity is None else capacity
        cache = self.model.init_cache(np.shape(tgt_in)[0], capacity) if self.config.decoder_only else \
            self.model.init_cache(self.model.encode(src), src, capacity)
        steps, start = [], 0
        for n in chunks if chunks is not None else [1] * T:
            logits, cache = self.model.decode(np.asarray(tgt_in)[:, start:start + n], cache)
            steps.append(logits)
            start += n
        return self.d.array(self.d.concat(steps))

    def greedy(self, src, max_new_tokens=None):
        return self.d.array(self.impl.greedy_search(self.model, src, max_new_tokens))

    def beam(self, src, beam_size=4, alpha=0.6, max_new_tokens=None):
        return self.d.array(self.impl.beam_search(self.model, src, beam_size, alpha, max_new_tokens))

    def generate(self, prompt, max_new_tokens, temperature=1.0, top_k=None, top_p=1.0, seed=0):
        with self.d.evaluating():
            return self.d.array(self.impl.generate(self.model, prompt, max_new_tokens, temperature, top_k, top_p,
                                                   seed))

    def run_layer(self, layer, prefix, inputs):
        c, layers = self.config, self.impl.layers
        if layer == "positional_encoding":
            halves = c.positions == "sinusoidal_halves"
            return {"pe": self.d.array(layers.positional_encoding(c.max_len, c.d_model, halves))}
        fn = LAYERS[layer]
        args = {k: self.d.tensor(v, self.model) for k, v in inputs.items()}
        module = self.modules.embedder if layer in ("embedding", "output_projection") else \
            None if layer == "scaled_dot_product_attention" else submodule(self.modules, prefix)
        out = self.d.run((layer, prefix, c), lambda m, i: fn(self, m, i), module, args)
        return {k: self.d.array(v) for k, v in out.items()}

    def save(self, path: Path) -> None:
        self.impl.save_weights(self.model, path)

    def train(self, batches, train_config, record_after):
        return train_through_api(self.impl, self.d.copy(self.impl, self.model), batches, train_config, record_after,
                                 self.d.array)


def _decoder_layer(a: ImplModel, m: Any, i: dict[str, Any]) -> dict[str, Any]:
    """One decoder layer over T tokens from an empty self-attention buffer of capacity T, with the given masks."""
    c, y = a.config, i["y"]
    B, T = y.shape[0], y.shape[1]
    empty = (a.d.zeros(y, (B, c.n_heads, T, c.d_k)), a.d.zeros(y, (B, c.n_heads, T, c.d_v)))
    out, _ = m.forward(y, empty, i["self_mask"], m.cross_attn.project_kv(i["memory"]), i["memory_mask"], 0)
    return {"out": out}


# Each entry of ``spec.shapes.LAYERS`` (but the positional encoding) as (adapter, module, inputs) -> outputs.
LAYERS: dict[str, Callable[[ImplModel, Any, dict[str, Any]], dict[str, Any]]] = {
    "embedding": lambda a, m, i: {"x": m.encode(i["ids"])},
    "scaled_dot_product_attention": lambda a, m, i: {"out": a.impl.layers.scaled_dot_product_attention(
        i["q"], a.d.heads_major(i["k"]), a.d.heads_major(i["v"]), i["mask"])},
    "multi_head_attention": lambda a, m, i: {"out": m.forward(i["x_q"], m.project_kv(i["x_kv"]), i["mask"])},
    "add_norm": lambda a, m, i: {"out": m.forward(a.d.add(i["x"], i["y"]))},
    "feed_forward": lambda a, m, i: {"out": m.forward(i["x"])},
    "encoder_layer": lambda a, m, i: {"out": m.forward(i["x"], i["mask"])},
    "decoder_layer": _decoder_layer,
    "output_projection": lambda a, m, i: {"logits": m.decode(i["h"])},
}
