"""The torch bench: ``impl_torch`` and ``torch.nn.Transformer`` as ``conformance.bench.common`` subjects.

Every subject computes under ``torch.inference_mode()`` in evaluation mode and returns only once the device has
finished (``.cpu()`` of the result; ``torch.cuda.synchronize()`` on CUDA). Run by ``conformance.bench.run``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

import impl_torch
from conformance.bench.common import clock
from spec.config import Config

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def setup(device: str) -> dict[str, Any]:
    """Process settings for the bench (TF32 off on CUDA, contract rule 8) and the environment to record."""
    env: dict[str, Any] = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False  # fp32 accumulation (rule 2)
        env.update(device_name=torch.cuda.get_device_name(), cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version())
    else:
        env["device_name"] = "cpu"  # the CPU model is in the run's machine record
    return env


def matmul(dtype: str, device: str, M: int, K: int, N: int) -> Callable[[], None]:
    """One (M, K) x (K, N) ``torch.mm`` with ``dtype`` operands (bf16: torch's native bf16 GEMM), synchronised."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(M, K, generator=gen).to(device=device, dtype=DTYPES[dtype])   # (M, K)
    b = torch.randn(K, N, generator=gen).to(device=device, dtype=DTYPES[dtype])   # (K, N)

    def run() -> None:
        with torch.inference_mode():
            torch.mm(a, b)                                                       # (M, N)
        _sync(device)
    return run


class Ours:
    """``impl_torch`` built with ``from_params``, in evaluation mode, through its public API only."""

    name = "impl_torch"

    def __init__(self, config: Config, params: dict[str, np.ndarray], device: str):
        self.model = impl_torch.from_params(config, params, device=device)
        self.dtype, self.device = config.dtype, device

    def forward(self, src: np.ndarray, tgt_in: np.ndarray) -> None:
        """src (B, S), tgt_in (B, T) -> logits (B, T, V) float32."""
        with torch.inference_mode():
            self.model(src, tgt_in).cpu()

    def greedy(self, src: np.ndarray, max_new_tokens: int) -> np.ndarray:
        """``impl_torch.greedy_search``: src (B, S) -> tokens (B, L) int64."""
        with torch.inference_mode():
            return impl_torch.greedy_search(self.model, src, max_new_tokens).cpu().numpy()

    def beam(self, src: np.ndarray, max_new_tokens: int, beam_size: int) -> np.ndarray:
        """``impl_torch.beam_search`` with alpha 0.6: src (B, S) -> tokens (B, L) int64."""
        with torch.inference_mode():
            return impl_torch.beam_search(self.model, src, beam_size, 0.6, max_new_tokens).cpu().numpy()

    def cached_steps(self, src: np.ndarray, n: int) -> list[float]:
        """Seconds of each of n greedy steps through ``decode`` with a cache of capacity n (encode untimed)."""
        c, times = self.model.config, []
        with torch.inference_mode():
            cache = self.model.init_cache(self.model.encode(src), src, n)
            tokens = torch.full((len(src), 1), c.bos_id, dtype=torch.long, device=self.device)   # (B, 1)
            _sync(self.device)
            for _ in range(n):
                start = clock()
                logits, cache = self.model.decode(tokens, cache)                   # (B, 1, V) fp32
                tokens = logits[:, -1].argmax(dim=-1, keepdim=True).cpu()          # (B, 1)
                times.append(clock() - start)
        return times

    def recomputed_steps(self, src: np.ndarray, n: int) -> list[float]:
        """Seconds of each of n greedy steps without a cache: ``model(src, prefix)`` on the t tokens so far."""
        c, times = self.model.config, []
        with torch.inference_mode():
            prefix = torch.full((len(src), 1), c.bos_id, dtype=torch.long)         # (B, t)
            for _ in range(n):
                start = clock()
                logits = self.model(src, prefix)                                   # (B, t, V) fp32
                next_token = logits[:, -1].argmax(dim=-1, keepdim=True).cpu()      # (B, 1)
                times.append(clock() - start)
                prefix = torch.cat([prefix, next_token], dim=1)
        return times


def ours(config: Config, params: dict[str, np.ndarray], device: str) -> Ours:
    """Our impl holding ``params``, computing in ``config.dtype``."""
    return Ours(config, params, device)


class Peer(nn.Module):
    """``torch.nn.Transformer`` at our hyperparameters (post-LN, dropout off), with one ``nn.Embedding`` shared by
    source, target and the tied output projection, scaled by sqrt(D), plus the sinusoidal PE; causal target mask.
    bf16 as ``model.to(torch.bfloat16)``; its own default initialisation."""

    name = "torch.nn.Transformer"

    def __init__(self, config: Config, device: str):
        super().__init__()
        c = config
        self.dtype, self.device = c.dtype, device
        self.embedding = nn.Embedding(c.vocab_size, c.d_model)
        self.transformer = nn.Transformer(
            d_model=c.d_model, nhead=c.n_heads, num_encoder_layers=c.n_encoder_layers,
            num_decoder_layers=c.n_decoder_layers, dim_feedforward=c.d_ff, dropout=0.0, batch_first=True,
            norm_first=False, layer_norm_eps=c.layer_norm_eps)
        self.register_buffer("pe", impl_torch.positional_encoding(c.max_len, c.d_model), persistent=False)
        self.to(device=device, dtype=DTYPES[c.dtype]).eval()

    def embed(self, ids: Tensor) -> Tensor:
        """(B, L) ids -> (B, L, D)."""
        return self.embedding(ids) * math.sqrt(self.embedding.embedding_dim) + self.pe[:ids.shape[1]]

    def forward(self, src: np.ndarray, tgt_in: np.ndarray) -> None:  # type: ignore[override]
        """src (B, S), tgt_in (B, T) -> logits (B, T, V) in the peer's dtype."""
        with torch.inference_mode():
            src_t, tgt_t = (torch.as_tensor(a, device=self.device) for a in (src, tgt_in))
            T = tgt_t.shape[1]
            mask = nn.Transformer.generate_square_subsequent_mask(T, device=self.pe.device, dtype=self.pe.dtype)
            h = self.transformer(self.embed(src_t), self.embed(tgt_t), tgt_mask=mask, tgt_is_causal=True)
            (h @ self.embedding.weight.T).cpu()                                    # (B, T, V)


def peer(config: Config, device: str) -> Peer:
    """The stock ``torch.nn.Transformer`` at ``config``'s hyperparameters, in ``config.dtype``, forward only."""
    return Peer(config, device)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
