"""``torch.nn.Transformer`` holding the canonical weights, as a torch user builds the paper's model from it.

The stock stacks (``nn.Transformer``; a decoder-only model: ``nn.TransformerEncoder`` under a causal mask, as
PyTorch's language-modelling tutorial builds one) at the config's hyperparameters, ``batch_first``, dropout 0,
in evaluation mode under ``torch.inference_mode()``; around them, as the user writes it (and ``bench.bench_torch``'s
peer does): one ``nn.Embedding`` scaled by sqrt(d_model), the positional table added, key padding masks from
``pad_id``, and the tied output projection ``F.linear(h, E)`` (plus the logits bias, where the config has one).
Post-LN configs drop the final LayerNorm ``nn.Transformer`` puts on each stack (the paper's model has none);
pre-LN ones load ``final_norm`` into it. Attention projections without biases in the config get zero biases.

bf16 (``config.dtype == "bfloat16"``): the whole module cast with ``model.to(torch.bfloat16)``, the way the bench's
peer runs it (``certify.adapters.nn_transformer_autocast``: the other way a user takes, autocast). Logits are
returned as float32 (``.float()`` of what the module computed).

Layers alone (``run_layer``): those torch's stock pieces compute alone (``certify.adapters.torch_layers``), for any
config. Not supported, with the reason: the stacks (forward, encode) and the attention and encoder or decoder
layers of a config whose d_k or d_v is not d_model / n_heads (``nn.MultiheadAttention``'s heads are that wide); a
KV cache, greedy and beam search, sampling (the library has none); dropout, training, saving, the spec's
``ValueError`` on bad ids (``nn.Embedding`` raises ``IndexError``).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from certify.adapters import common, torch_layers, torch_names
from conformance.adapters.base import NotSupported
from spec.config import Config
from spec.reference.layers import positional_encoding
from spec.weights_io import load_weights

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
               "silu": F.silu}  # nn.Transformer takes a name or a callable
SUPPORTS = frozenset({"encoder_decoder", "decoder_only", "float32", "bfloat16", "forward", "intermediates",
                      "encode", "layers"})


def inexpressible(config: Config) -> str | None:
    """What ``nn.Transformer``'s stacks cannot express of ``config``, None if nothing."""
    if not config.d_k == config.d_v == config.d_model // config.n_heads or config.d_model % config.n_heads:
        return (f"nn.MultiheadAttention's heads are d_model / n_heads = {config.d_model / config.n_heads:g} wide; "
                f"the config has d_k={config.d_k}, d_v={config.d_v}")
    return None


class Stock(nn.Module):
    """The stock stacks plus the user's embedding, positions and tied projection (module docstring); without
    ``stacks``, the user's pieces alone (for the layers of a config the stacks cannot express)."""

    def __init__(self, c: Config, stacks: bool = True):
        super().__init__()
        self.config = c
        self.embedding = nn.Embedding(c.vocab_size, c.d_model)
        kw = dict(d_model=c.d_model, nhead=c.n_heads, dim_feedforward=c.d_ff, dropout=0.0,
                  activation=ACTIVATIONS[c.activation], layer_norm_eps=c.layer_norm_eps, batch_first=True,
                  norm_first=c.norm_first)
        if stacks and c.decoder_only:
            final = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps) if c.norm_first else None
            self.decoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(**kw), c.n_decoder_layers, final)
        elif stacks:
            self.transformer = nn.Transformer(num_encoder_layers=c.n_encoder_layers,
                                              num_decoder_layers=c.n_decoder_layers, **kw)
            if not c.norm_first:
                self.transformer.encoder.norm = self.transformer.decoder.norm = None
        if c.positions == "learned":
            self.position_embedding = nn.Parameter(torch.zeros(c.max_len, c.d_model))
        else:
            pe = positional_encoding(c.max_len, c.d_model, c.positions == "sinusoidal_halves")
            self.register_buffer("pe", torch.from_numpy(pe.astype(np.float32)), persistent=False)
        if c.logits_bias:
            self.logits_bias = nn.Parameter(torch.zeros(c.vocab_size))

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, L) ids -> E[ids] * sqrt(D) + PE[:L], (B, L, D) in the module's dtype."""
        x = self.embedding(ids)
        if self.config.scale_embedding:
            x = x * math.sqrt(self.config.d_model)
        return x + (self.position_embedding if self.config.positions == "learned" else self.pe)[:ids.shape[1]]

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """(..., D) -> logits (..., V) by the tied embedding, float32."""
        return F.linear(h, self.embedding.weight, getattr(self, "logits_bias", None)).float()

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        return self.transformer.encoder(self.embed(src), src_key_padding_mask=src == self.config.pad_id)

    def forward(self, src: torch.Tensor | None, tgt: torch.Tensor) -> torch.Tensor:
        """src (B, S) or None (decoder-only), tgt (B, T) -> logits (B, T, V) float32."""
        pad, T = self.config.pad_id, tgt.shape[1]
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)                 # True: masked
        if src is None:
            h = self.decoder(self.embed(tgt), mask=causal, src_key_padding_mask=tgt == pad, is_causal=True)
        else:
            h = self.transformer(self.embed(src), self.embed(tgt), tgt_mask=causal, tgt_is_causal=True,
                                 src_key_padding_mask=src == pad, tgt_key_padding_mask=tgt == pad,
                                 memory_key_padding_mask=src == pad)
        return self.project(h)


class Model(common.Unsupported):
    """A ``Stock`` module holding one weights file, behind the suite's ``Model`` protocol."""

    why = "torch.nn.Transformer has none (no KV cache, no search, no sampler)"

    def __init__(self, config: Config, module: Stock, params: dict[str, np.ndarray], autocast: bool,
                 inexpressible: str | None):
        self.config, self.module, self.params, self.autocast = config, module, params, autocast
        self.inexpressible = inexpressible
        self.dtype = torch.float32 if autocast else common.TORCH_DTYPES[config.dtype]

    def _stacks(self) -> None:
        if self.inexpressible:
            raise NotSupported(self.inexpressible)

    def _run(self, fn, *args):
        """``fn(*args)`` as the user runs inference: ``inference_mode``, and (``autocast``) bf16 CPU autocast with
        the stock layers' fast path off, which fails under CPU autocast in evaluation (torch 2.13: "expected scalar
        type Float but found BFloat16"; ``tools.peer_torch`` turns it off likewise)."""
        fastpath = torch.backends.mha.get_fastpath_enabled()
        try:
            torch.backends.mha.set_fastpath_enabled(fastpath and not self.autocast)
            with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=self.autocast):
                return fn(*args)
        finally:
            torch.backends.mha.set_fastpath_enabled(fastpath)

    def forward(self, src, tgt_in, intermediates=False, dropout_seed=None):
        """Logits (B, T, V) float32 of the stock call; with ``intermediates`` what a forward hook observes of it:
        the embeddings, each layer's output and each stack's (torch turns a layer's fused fast path off while a
        hook is attached to it, so the logits then come from the unfused layers)."""
        if dropout_seed is not None:
            raise NotSupported("the adapter runs the stock layers in evaluation mode: no dropout draws to compare")
        self._stacks()
        src_t = None if src is None else common.ids(src)
        if not intermediates:
            return self._run(self.module, src_t, common.ids(tgt_in)).numpy(), {}
        rec, handles = {}, []
        c = self.config
        for name, (m, where) in observed(self.module, c.decoder_only, c.norm_first).items():
            hook = functools.partial(_record, rec, name)
            handles.append(m.register_forward_hook(hook) if where == "out" else m.register_forward_pre_hook(hook))
        try:
            logits = self._run(self.module, src_t, common.ids(tgt_in))
        finally:
            for h in handles:
                h.remove()
        embed = [("tgt_embed", tgt_in)] + ([] if src is None else [("src_embed", src)])
        rec |= {n: common.host(self._run(self.module.embed, common.ids(x))) for n, x in embed}
        return logits.numpy(), rec

    def run_layer(self, layer, prefix, inputs):
        """The layers torch's stock pieces compute alone (``certify.adapters.torch_layers``)."""
        if layer not in torch_layers.ALONE and self.inexpressible:
            raise NotSupported(self.inexpressible)
        out = self._run(torch_layers.run, layer, self.module, self.params, prefix, inputs, self.dtype)
        return {k: common.host(v) for k, v in out.items()}

    def encode(self, src):
        if self.config.decoder_only:
            raise NotSupported("a decoder-only model has no encoder")
        self._stacks()
        return common.host(self._run(self.module.encode, common.ids(src)))


def observed(module: Stock, decoder_only: bool, norm_first: bool) -> dict[str, tuple[nn.Module, str]]:
    """The spec's intermediate name -> (the stock module, "out" or "in"): the tensor is that module's output (an
    attention's first) or, ``in``, its input. A post-LN residual is its norm's output; a pre-LN one the next norm's
    input, or the layer's output."""
    stacks = {"decoder": module.decoder} if decoder_only else {"encoder": module.transformer.encoder,
                                                                "decoder": module.transformer.decoder}
    out = {}
    for name, stack in stacks.items():
        for i, layer in enumerate(stack.layers):
            p = f"{name}.layers.{i}"
            cross = [("cross_attn", layer.multihead_attn)] if hasattr(layer, "multihead_attn") else []
            subs = [("self_attn", layer.self_attn), *cross, ("ffn", layer.linear2)]
            norms = [getattr(layer, f"norm{k}") for k in range(1, len(subs) + 1)]
            for k, (sub, m) in enumerate(subs):
                out[f"{p}.{sub}"] = (m, "out")
                last = k == len(subs) - 1
                out[f"{p}.{sub}.residual"] = (layer, "out") if norm_first and last else (
                    (norms[k + 1], "in") if norm_first else (norms[k], "out"))
            out[f"{p}.out"] = (layer, "out")
        out[f"{name}.out"] = (stack, "out")
    return out


def _record(rec: dict, name: str, _module, inputs, output=None) -> None:
    t = inputs[0] if output is None else output[0] if isinstance(output, tuple) else output
    rec[name] = common.host(t.to_padded_tensor(0.0) if t.is_nested else t)


class Backend:
    """Loads a canonical weights file into ``Stock``; ``autocast``: fp32 weights under bf16 autocast for bf16."""

    name = "torch.nn.Transformer"
    supports = SUPPORTS

    def __init__(self, autocast: bool = False):
        self.autocast = autocast
        if autocast:
            self.name, self.supports = f"{self.name} (autocast)", SUPPORTS - {"float32"}

    def load(self, path: Path) -> Model:
        config, params = load_weights(path)
        common.require(config, ("bfloat16",) if self.autocast else ("float32", "bfloat16"),
                       ("encoder_decoder", "decoder_only"), self.name)
        why = inexpressible(config)
        module = Stock(config, stacks=why is None)
        state = torch_names.state_dict(config, params, stacks=why is None)
        module.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
        cast = torch.float32 if self.autocast else common.TORCH_DTYPES[config.dtype]
        return Model(config, module.to(cast).eval(), params, self.autocast, why)

    def describe(self) -> str:
        how = "bf16 by torch.autocast, fp32 weights" if self.autocast else "bf16 by model.to(torch.bfloat16)"
        return common.describe(f"torch.nn.Transformer ({how})", "")

    sample = staticmethod(common.no_sampling)


def make_backend() -> Backend:
    return Backend()
