"""impl_torch as a conformance backend, through its public API only.

NumPy crosses in both directions: token ids are passed through as given (impl_torch validates them), bf16
activations come back as ``ml_dtypes.bfloat16``, logits as float32. Runs on CUDA when available, else CPU, inside
``impl_torch.numerics_scope()`` for the whole session. ``AIAYN_TORCH_NATIVE_BF16=1`` in the environment builds the
models with ``native_bf16=True`` (CPU bf16 products as native bf16 GEMMs, ``impl_torch.numerics``); the default is
the library's default, fp32 GEMMs of the upcast operands.
"""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path

import numpy as np
import torch

import impl_torch
from conformance.adapters.base import train_through_api
from spec.config import Config

FP32_OUTPUTS = {"pe", "logits"}
NATIVE_BF16 = os.environ.get("AIAYN_TORCH_NATIVE_BF16", "0") == "1"


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class TorchModel:
    def __init__(self, model: impl_torch.Transformer):
        self.model = model
        self.config: Config = model.config

    def _np(self, t: torch.Tensor) -> np.ndarray:
        return impl_torch.to_array(t)

    def _in(self, a: np.ndarray) -> torch.Tensor:
        """A float or bool input array as a tensor on the model's device (ids and masks as they are)."""
        return impl_torch.to_tensor(np.asarray(a)).to(self.model.embedding.device)

    @torch.inference_mode()
    def forward(self, src, tgt_in, intermediates=False):
        if not intermediates:
            return self._np(self.model(src, tgt_in)), {}
        logits, inter = self.model(src, tgt_in, intermediates=True)
        return self._np(logits), {k: self._np(v) for k, v in inter.items()}

    @torch.inference_mode()
    def encode(self, src):
        return self._np(self.model.encode(src))

    @torch.inference_mode()
    def decode_steps(self, src, tgt_in, chunks=None, capacity=None):
        T = np.shape(tgt_in)[1]
        cache = self.model.init_cache(self.model.encode(src), src, capacity=T if capacity is None else capacity)
        steps, start = [], 0
        for n in chunks if chunks is not None else [1] * T:
            logits, cache = self.model.decode(tgt_in[:, start:start + n], cache)
            steps.append(logits)
            start += n
        return self._np(torch.cat(steps, dim=1))

    def greedy(self, src, max_new_tokens=None):
        return impl_torch.greedy_search(self.model, src, max_new_tokens).cpu().numpy()

    def beam(self, src, beam_size=4, alpha=0.6, max_new_tokens=None):
        return impl_torch.beam_search(self.model, src, beam_size, alpha, max_new_tokens).cpu().numpy()

    @torch.inference_mode()
    def run_layer(self, layer, prefix, inputs):
        out = {k: self._np(v) for k, v in self._run_layer(layer, prefix, {k: self._in(v) for k, v in inputs.items()})
               .items()}
        return {k: v.astype(np.float32) if k in FP32_OUTPUTS else v for k, v in out.items()}

    def _run_layer(self, layer: str, prefix: str, i: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        m, c = self.model, self.config
        if layer == "positional_encoding":
            return {"pe": impl_torch.positional_encoding(c.max_len, c.d_model, m.embedding.device)}
        if layer == "embedding":
            return {"x": m.embedder.encode(i["ids"])}
        if layer == "scaled_dot_product_attention":  # k, v (B, S, H, K|C) -> heads-major
            fused = m.embedding.device.type == "cuda"
            k, v = i["k"].transpose(1, 2), i["v"].transpose(1, 2)
            return {"out": impl_torch.scaled_dot_product_attention(i["q"], k, v, i["mask"], fused=fused)}
        if layer == "output_projection":
            return {"logits": m.embedder.decode(i["h"])}
        mod = m.get_submodule(prefix)
        if layer == "multi_head_attention":
            return {"out": mod(i["x_q"], mod.project_kv(i["x_kv"]), i["mask"])}
        if layer == "add_norm":  # the post-LN residual line: the sum rounded, then the norm
            return {"out": mod(i["x"] + i["y"])}
        if layer == "feed_forward":
            return {"out": mod(i["x"])}
        if layer == "encoder_layer":
            return {"out": mod(i["x"], i["mask"])}
        if layer == "decoder_layer":
            B, T, _ = i["y"].shape
            empty = [i["y"].new_empty(B, c.n_heads, T, d) for d in (c.d_k, c.d_v)]  # the self-attention buffer
            memory_kv = mod.cross_attn.project_kv(i["memory"])
            return {"out": mod(i["y"], empty, i["self_mask"], memory_kv, i["memory_mask"], 0)[0]}
        raise ValueError(f"unknown layer {layer!r}")

    def save(self, path: Path) -> None:
        impl_torch.save_weights(self.model, path)

    def train(self, batches, train_config, record_after):
        model = impl_torch.from_params(self.config, impl_torch.params_of(self.model),  # a copy
                                       device=self.model.embedding.device, native_bf16=NATIVE_BF16)
        return train_through_api(impl_torch, model, batches, train_config, record_after, self._np)


class TorchBackend:
    name = "torch"
    module = impl_torch

    def __init__(self):
        # Entered for the life of the backend, i.e. the session: the stack holds the contexts (a generator context
        # that is garbage-collected would exit, restoring the flags), and nothing closes it.
        self._session = contextlib.ExitStack()
        self._session.enter_context(impl_torch.numerics_scope())  # TF32 off, fp32 reductions in bf16 GEMMs (CUDA)
        torch.use_deterministic_algorithms(True, warn_only=True)

    def load(self, path: Path) -> TorchModel:
        return TorchModel(impl_torch.load_weights(path, device=_device(), native_bf16=NATIVE_BF16))

    def describe(self) -> str:
        dev = _device()
        where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"{platform.machine()} CPU"
        return f"PyTorch {torch.__version__}, {where}"


def make_backend() -> TorchBackend:
    return TorchBackend()
