"""The torch bench: ``impl_torch`` and ``torch.nn.Transformer`` as ``bench.common`` subjects.

Every subject computes under ``torch.inference_mode()`` in evaluation mode and returns only once the device has
finished (``.cpu()`` of the result; ``torch.cuda.synchronize()`` on CUDA); the peer's training step (``PeerTrainer``)
ends with ``loss.item()``. Run by ``bench.run``. ``AIAYN_TORCH_NATIVE_BF16=1`` in the environment builds ``impl_torch``
with ``native_bf16=True`` (CPU bf16 products as native bf16 GEMMs; the default: fp32 GEMMs of the upcast operands),
so a run each way measures both paths.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

import impl_torch
from bench.common import TRAIN, clock, peer_learning_rate
from spec.config import Config

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
NATIVE_BF16 = os.environ.get("AIAYN_TORCH_NATIVE_BF16", "0") == "1"


def setup(device: str) -> dict[str, Any]:
    """Process settings for the bench (TF32 off on CUDA, contract rule 8) and the environment to record."""
    env: dict[str, Any] = {"torch": torch.__version__, "threads": torch.get_num_threads(), "native_bf16": NATIVE_BF16}
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
        self.model = impl_torch.from_params(config, params, device=device, native_bf16=NATIVE_BF16)
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
    """``torch.nn.Transformer`` at our hyperparameters (post-LN), with one ``nn.Embedding`` shared by source, target
    and the tied output projection, scaled by sqrt(D), plus the sinusoidal PE (and ``dropout`` after it, as the
    stock layers drop inside); causal target mask. For the forward: dropout off, evaluation mode, bf16 as
    ``model.to(torch.bfloat16)``; for training (``train=True``): fp32 parameters in training mode. Its own
    default initialisation."""

    name = "torch.nn.Transformer"

    def __init__(self, config: Config, device: str, dropout: float = 0.0, train: bool = False):
        super().__init__()
        c = config
        self.dtype, self.device = c.dtype, device
        self.embedding = nn.Embedding(c.vocab_size, c.d_model)
        self.dropout = nn.Dropout(dropout)
        self.transformer = nn.Transformer(
            d_model=c.d_model, nhead=c.n_heads, num_encoder_layers=c.n_encoder_layers,
            num_decoder_layers=c.n_decoder_layers, dim_feedforward=c.d_ff, dropout=dropout, batch_first=True,
            norm_first=False, layer_norm_eps=c.layer_norm_eps)
        self.register_buffer("pe", impl_torch.layers.positional_encoding(c.max_len, c.d_model), persistent=False)
        self.to(device=device, dtype=torch.float32 if train else DTYPES[c.dtype]).train(train)

    def embed(self, ids: Tensor) -> Tensor:
        """(B, L) ids -> (B, L, D)."""
        return self.dropout(self.embedding(ids) * math.sqrt(self.embedding.embedding_dim) + self.pe[:ids.shape[1]])

    def logits(self, src: np.ndarray, tgt_in: np.ndarray) -> Tensor:
        """src (B, S), tgt_in (B, T) -> logits (B, T, V) in the parameters' (or autocast's) dtype."""
        src_t, tgt_t = (torch.as_tensor(a, device=self.device) for a in (src, tgt_in))
        T = tgt_t.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(T, device=self.pe.device, dtype=self.pe.dtype)
        h = self.transformer(self.embed(src_t), self.embed(tgt_t), tgt_mask=mask, tgt_is_causal=True)
        return h @ self.embedding.weight.T                                        # (B, T, V)

    def forward(self, src: np.ndarray, tgt_in: np.ndarray) -> None:  # type: ignore[override]
        """src (B, S), tgt_in (B, T) -> logits (B, T, V) in the peer's dtype."""
        with torch.inference_mode():
            self.logits(src, tgt_in).cpu()                                        # (B, T, V)


def peer(config: Config, device: str) -> Peer:
    """The stock ``torch.nn.Transformer`` at ``config``'s hyperparameters, in ``config.dtype``, forward only."""
    return Peer(config, device)


class PeerTrainer:
    """The peer's training step as a torch user writes it: fp32 parameters, the forward under
    ``torch.autocast(dtype=torch.bfloat16)`` for bf16 (none for fp32), dropout ``config.dropout``,
    ``nn.CrossEntropyLoss(ignore_index=pad_id, label_smoothing=0.1)`` on the fp32 logits, ``backward``,
    ``torch.optim.Adam`` (foreach) at a constant learning rate; ``loss.item()`` synchronises."""

    name = Peer.name

    def __init__(self, config: Config, device: str):
        self.model = Peer(config, device, dropout=config.dropout, train=True)
        self.dtype, self.device = config.dtype, device
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=peer_learning_rate(config),
                                          betas=(TRAIN.beta1, TRAIN.beta2), eps=TRAIN.adam_eps)
        self.loss = nn.CrossEntropyLoss(ignore_index=config.pad_id, label_smoothing=TRAIN.label_smoothing)

    def step(self, src: np.ndarray, tgt_in: np.ndarray, tgt_out: np.ndarray) -> None:
        """src (B, S), tgt_in (B, T), tgt_out (B, T): one Adam step."""
        y = torch.as_tensor(tgt_out, device=self.device)                          # (B, T)
        with torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.dtype == "bfloat16"):
            logits = self.model.logits(src, tgt_in)                               # (B, T, V)
        loss = self.loss(logits.float().flatten(0, 1), y.flatten())               # () float32
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        loss.item()


def peer_trainer(config: Config, device: str) -> PeerTrainer:
    """The stock peer's own training step in ``config.dtype`` (mixed precision for bf16), fp32 master weights."""
    return PeerTrainer(config, device)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
