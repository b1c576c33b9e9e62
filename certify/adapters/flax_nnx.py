"""Flax NNX's stock layers holding the canonical weights, one layer at a time (``run_layer``), as the bench's Flax
NNX peer builds its blocks: ``nnx.dot_product_attention``, ``nnx.MultiHeadAttention`` (its kernels laid out as the
spec's: query, key and value (D, H, K), output (H, K, D)), ``nnx.LayerNorm`` of ``x + y``, two ``nnx.Linear`` with
the activation between them, ``nnx.Embed`` times sqrt(D) plus the positional table (the spec's sinusoids, or the
learned rows), and the tied projection ``nnx.Embed.attend`` (plus the logits bias). bf16 as a Flax user asks for
it: each layer built with ``dtype=jnp.bfloat16`` (its computation) and ``param_dtype`` the config's; Flax's defaults
otherwise (``nnx.LayerNorm``'s ``use_fast_variance=True``).

Not supported: d_k != d_v, in ``nnx.MultiHeadAttention`` (one ``qkv_features`` sets every head's width) and in
``nnx.dot_product_attention`` (it calls ``jax.nn.dot_product_attention``, which requires it), the whole
model (Flax has no stock Transformer) and everything but layers."""

from __future__ import annotations

from pathlib import Path

import flax
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from certify.adapters import common
from conformance.adapters.base import NotSupported
from spec.config import Config
from spec.reference.layers import positional_encoding
from spec.weights_io import load_weights

ACTIVATIONS = {"relu": nnx.relu, "gelu": lambda x: nnx.gelu(x, approximate=False), "silu": nnx.silu,
               "gelu_tanh": lambda x: nnx.gelu(x, approximate=True)}
LAYERS = ("scaled_dot_product_attention", "multi_head_attention", "add_norm", "feed_forward", "embedding",
          "output_projection")


def host(x: jax.Array) -> np.ndarray:
    """A JAX activation as NumPy in its own dtype (bf16 as ``ml_dtypes.bfloat16``)."""
    a = np.asarray(x)
    return a.astype(ml_dtypes.bfloat16) if a.dtype == jnp.bfloat16 else a


def _set(module, **values: np.ndarray) -> None:
    """Each named parameter of ``module`` to a canonical weight, in the parameter's own dtype."""
    for path, value in values.items():
        *parents, leaf = path.split(".")
        owner = module
        for p in parents:
            owner = getattr(owner, p)
        param = getattr(owner, leaf)
        param[...] = jnp.asarray(np.asarray(value, np.float32).reshape(param.shape), param.dtype)


class Model(common.Unsupported):
    why = "Flax has no stock Transformer model; only its layers are mapped"

    def __init__(self, config: Config, params: dict[str, np.ndarray]):
        self.config, self.params = config, params
        self.dt, self.pdt = jnp.dtype(config.dtype), jnp.dtype(config.param_dtype)
        self.rngs = nnx.Rngs(0)

    def run_layer(self, layer, prefix, inputs):
        if layer not in LAYERS:
            raise NotSupported(f"{layer}: the adapter maps only Flax NNX's stock {', '.join(LAYERS)}")
        x = {k: v if v.dtype == bool or v.dtype.kind == "i" else jnp.asarray(np.asarray(v, np.float32), self.dt)
             for k, v in inputs.items()}
        return {k: host(v) for k, v in getattr(self, f"_{layer}")(prefix, x).items()}

    def _scaled_dot_product_attention(self, prefix, x):  # (B, T, H, K) as the spec's; mask True: may attend
        if x["q"].shape[-1] != x["v"].shape[-1]:
            raise NotSupported("nnx.dot_product_attention calls jax.nn.dot_product_attention, which takes values "
                               "as wide as the queries only (d_v == d_k)")
        return {"out": nnx.dot_product_attention(x["q"], x["k"], x["v"], mask=x["mask"], dtype=self.dt)}

    def _multi_head_attention(self, prefix, x):
        c, p = self.config, self.params
        if c.d_k != c.d_v:
            raise NotSupported(f"nnx.MultiHeadAttention gives every head one width (qkv_features / num_heads), "
                               f"not d_k={c.d_k} and d_v={c.d_v}")
        mha = nnx.MultiHeadAttention(c.n_heads, c.d_model, qkv_features=c.n_heads * c.d_k, out_features=c.d_model,
                                     use_bias=c.attention_bias, decode=False, dtype=self.dt, param_dtype=self.pdt,
                                     rngs=self.rngs)
        names = {"q": "query", "k": "key", "v": "value", "o": "out"}
        _set(mha, **{f"{m}.kernel": p[f"{prefix}.w_{n}"] for n, m in names.items()})
        if c.attention_bias:
            _set(mha, **{f"{m}.bias": p[f"{prefix}.b_{n}"] for n, m in names.items()})
        return {"out": mha(x["x_q"], x["x_kv"], mask=x["mask"])}

    def _add_norm(self, prefix, x):
        c = self.config
        norm = nnx.LayerNorm(c.d_model, epsilon=c.layer_norm_eps, dtype=self.dt, param_dtype=self.pdt, rngs=self.rngs)
        _set(norm, scale=self.params[f"{prefix}.scale"], bias=self.params[f"{prefix}.bias"])
        return {"out": norm(x["x"] + x["y"])}

    def _feed_forward(self, prefix, x):
        c, p = self.config, self.params
        lin1, lin2 = (nnx.Linear(i, o, dtype=self.dt, param_dtype=self.pdt, rngs=self.rngs)
                      for i, o in ((c.d_model, c.d_ff), (c.d_ff, c.d_model)))
        _set(lin1, kernel=p[f"{prefix}.w_1"], bias=p[f"{prefix}.b_1"])
        _set(lin2, kernel=p[f"{prefix}.w_2"], bias=p[f"{prefix}.b_2"])
        return {"out": lin2(ACTIVATIONS[c.activation](lin1(x["x"])))}

    def _embed(self) -> nnx.Embed:
        c = self.config
        embed = nnx.Embed(c.vocab_size, c.d_model, dtype=self.dt, param_dtype=self.pdt, rngs=self.rngs)
        _set(embed, embedding=self.params["embedding"])
        return embed

    def _embedding(self, prefix, x):  # E[ids] * sqrt(D) + PE, the user's code around nnx.Embed
        c, ids = self.config, jnp.asarray(x["ids"])
        h = self._embed()(ids)
        if c.scale_embedding:
            h = h * jnp.sqrt(c.d_model).astype(self.dt)  # in the activation dtype, as bf16 code keeps scalars
        if c.positions == "learned":
            pe = jnp.asarray(np.asarray(self.params["position_embedding"], np.float32), self.pdt)
        else:
            pe = jnp.asarray(positional_encoding(ids.shape[1], c.d_model, c.positions == "sinusoidal_halves"))
        return {"x": h + pe[:ids.shape[1]].astype(self.dt)}

    def _output_projection(self, prefix, x):
        logits = self._embed().attend(x["h"])
        if self.config.logits_bias:
            logits = logits + jnp.asarray(np.asarray(self.params["logits_bias"], np.float32), self.dt)
        return {"logits": logits.astype(jnp.float32)}


class Backend:
    name = "flax.nnx layers"
    supports = frozenset({"encoder_decoder", "decoder_only", "float32", "bfloat16", "layers"})

    def load(self, path: Path) -> Model:
        return Model(*load_weights(path))

    def describe(self) -> str:
        return (f"flax {flax.__version__} nnx layers, jax {jax.__version__} on {jax.default_backend()} (bf16 by "
                f"dtype=jnp.bfloat16), one layer at a time")

    sample = staticmethod(common.no_sampling)


def make_backend() -> Backend:
    return Backend()
