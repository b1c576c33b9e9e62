"""The Transformer's layers (Vaswani et al., 2017, section 3) under the numerics contract of ``spec.numerics``.

Shape letters of ``spec.config``. Queries are laid out (B, L, H, K); keys and values heads-major (B, H, L, K),
the KV cache's layout (``spec.api``): a cache write per step is a slice along L, and attention's per-head
products read it in place. Every parameter product goes through ``numerics.linear`` (rule 2); ``native_bf16``
picks its CPU GEMM (``impl_torch.numerics``). Dropout draws from the ``torch.Generator`` passed as ``rng``
(None: evaluation, the identity), never from torch's global RNG. The encoder and decoder layers built of these are
``impl_torch.stacks``'.
"""

from __future__ import annotations

import functools
import math
import weakref

import ml_dtypes
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from impl_torch.numerics import linear, logits, matmul_f32, round_to
from spec.config import Config
from spec.numerics import MASKED_SCORE
from spec.recording import record

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def to_tensor(a: np.ndarray) -> Tensor:
    """A NumPy array (bf16 as ``ml_dtypes.bfloat16``) as a CPU tensor with the same bits."""
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)  # NumPy has no bf16
    return torch.from_numpy(np.ascontiguousarray(a))


def to_array(t: Tensor) -> np.ndarray:
    """A tensor as a NumPy array with the same bits (bf16 as ``ml_dtypes.bfloat16``)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def parameter(config: Config, params: dict[str, np.ndarray], name: str, device: torch.device | str | None
              ) -> nn.Parameter:
    """The canonical parameter ``params[name]`` as an ``nn.Parameter`` of its own storage (a copy: training writes
    it in place) in ``config.param_dtype`` on ``device``."""
    return nn.Parameter(to_tensor(params[name]).to(device=device, dtype=DTYPES[config.param_dtype], copy=True))


def dropout(x: Tensor, site: str, rate: float, rng: torch.Generator | None) -> Tensor:
    """Inverted dropout at a dropout site (section 5.4, ``spec.shapes.dropout_sites``): x (B, L, D) -> (B, L, D),
    each element kept with probability 1 - rate, drawn from ``rng``, and divided by 1 - rate in fp32 (the divisor
    rounded to fp32), the quotient rounded once to x's dtype; the identity when ``rng`` is None (evaluation,
    rule 8) or ``rate`` is 0. Records the result as ``site`` and, with dropout, the keep mask as ``<site>.keep``
    (bool, True = kept)."""
    if rng is None or rate == 0.0:
        return record(site, x)
    keep = record(f"{site}.keep", torch.empty_like(x).bernoulli_(1.0 - rate, generator=rng).bool())
    # A divisor on x's device: dividing by a Python or CPU scalar, CUDA multiplies by its fp32 reciprocal, which
    # is not always the correctly rounded quotient.
    divisor = torch.tensor(1.0 - rate, dtype=torch.float32, device=x.device)
    return record(site, torch.where(keep, x.float() / divisor, 0.0).to(x.dtype))


def positional_encoding(length: int, d_model: int, halves: bool = False,
                        device: torch.device | str | None = None) -> Tensor:
    """The sinusoidal table (section 3.5), (L, D) float32, interleaved, positions from 0.

    ``PE[pos, 2i] = sin(pos / 10000^(2i/D))``, ``PE[pos, 2i+1] = cos(...)``; with ``halves``
    (``config.positions="sinusoidal_halves"``) the same D/2 sines fill the first half and the cosines the second.
    Computed in float64 on the CPU (not every device has float64) and rounded once to float32.
    """
    pos = torch.arange(length, dtype=torch.float64)[:, None]           # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)           # (D/2,)
    angle = pos / 10000.0 ** (two_i / d_model)                         # (L, D/2)
    if halves:
        pe = torch.cat([angle.sin(), angle.cos()], dim=-1)             # (L, D): every sin, then every cos
    else:
        pe = torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1)  # (L, D): sin, cos interleaved
    return pe.to(device=device, dtype=torch.float32)


class Embedder(nn.Module):
    """The one embedding table E (V, D), shared by source, target and the output projection (section 3.4), the
    positions and, with ``config.logits_bias``, the logits' ``bias`` (V,).

    ``encode``: ids -> ``E[ids] * sqrt(D) + PE`` (sections 3.4, 3.5; the factor 1 without
    ``config.scale_embedding``), before dropout (the model's); ``decode``: h -> h E^T (+ bias), the logits. PE is
    the learned ``positions`` (max_len, D) with ``config.positions="learned"``, else ``pe``, a non-persistent fp32
    buffer of ``max_len`` rows in the configured layout (``positions`` None then; ``pe`` None with learned ones).
    """

    def __init__(self, config: Config, params: dict[str, np.ndarray], device: torch.device | str | None = None, *,
                 native_bf16: bool = False):
        super().__init__()
        self.native_bf16 = native_bf16
        own = functools.partial(parameter, config, params, device=device)
        self.table = own("embedding")                                           # (V, D)
        learned = config.positions == "learned"
        self.positions = own("position_embedding") if learned else None         # (max_len, D)
        self.bias = own("logits_bias") if config.logits_bias else None          # (V,)
        pe = None if learned else positional_encoding(config.max_len, config.d_model,
                                                      config.positions == "sinusoidal_halves", device)
        self.register_buffer("pe", pe, persistent=False)
        self.scale = math.sqrt(config.d_model) if config.scale_embedding else None
        self.dtype = DTYPES[config.dtype]
        self._rounded: tuple | None = None  # rounded_table's (weak reference to the table, its version, copy)

    def encode(self, ids: Tensor, start: int = 0) -> Tensor:
        """ids (B, L) at positions start..start+L-1 -> (B, L, D): the sum in fp32, rounded once (rule 3); rows of
        the table and of learned positions enter in the activation dtype (rule 0)."""
        x = round_to(F.embedding(ids, self.table), self.dtype)                  # (B, L, D) fp32
        x = x if self.scale is None else x * self.scale
        end = start + ids.shape[1]
        pe = self.pe[start:end] if self.positions is None else round_to(self.positions[start:end], self.dtype)
        return (x + pe).to(self.dtype)

    def decode(self, x: Tensor) -> Tensor:
        """Tied output projection x E^T (section 3.4, rule 7), plus the logits' bias if any (entering in the
        activation dtype): (B, L, D) -> (B, L, V) float32, never rounded. The table enters as ``rounded_table()``,
        kept between the steps of a decoding loop."""
        table = self.rounded_table()
        bias = None if self.bias is None else round_to(self.bias, self.dtype)   # (V,) fp32
        return logits(x, table, bias, native_bf16=self.native_bf16)

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_rounded": None}  # a weak reference does not pickle; it is remade

    def rounded_table(self) -> Tensor:
        """The table as it enters the output product (rule 0): (V, D) fp32 holding ``config.dtype`` values; a copy
        of V x D fp32 (the table itself for fp32 compute on fp32 weights). Outside autograd the copy is kept with
        the module and made again only when the table changes (another tensor, or written in place: its version
        counter), so a decode step does not convert V x D values; under autograd it is made each call, as the
        straight-through rounding of ``round_to``."""
        if self.table.requires_grad and torch.is_grad_enabled():
            return round_to(self.table, self.dtype)
        key = (self.table._version, self.table.data_ptr(), self.dtype, torch.is_inference_mode_enabled())
        if self._rounded is None or self._rounded[0]() is not self.table or self._rounded[1] != key:
            self._rounded = (weakref.ref(self.table), key, round_to(self.table.detach(), self.dtype))
        return self._rounded[2]


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) V (equation 1, rule 4): q (B, T, H, K), heads-major k (B, H, S, K) and
    v (B, H, S, C), mask bool broadcastable to (B, H, T, S), True = may attend -> (B, T, H, C) in ``q.dtype``.

    The contract written out: fp32 scores, scaled in fp32, masked with ``MASKED_SCORE``, fp32 max-subtracted
    softmax, probabilities rounded to ``q.dtype`` before P V; a query row whose keys are all masked gets a finite
    output. PyTorch's fused kernels round elsewhere, on the CPU and on CUDA (``docs/decisions-torch.md``).
    """
    dtype = q.dtype
    q = q.transpose(1, 2)                                                   # (B, H, T, K) view
    scores = torch.matmul(q.float(), k.float().transpose(2, 3))             # (B, H, T, S) fp32, never rounded
    scores = scores * (1.0 / math.sqrt(q.shape[-1]))                        # scaled in fp32
    scores = scores.masked_fill(~mask, MASKED_SCORE)                        # masked keys get exactly zero weight
    probs = torch.softmax(scores, dim=-1).to(dtype)                        # fp32 softmax, rounded before P V
    return matmul_f32(probs, v).to(dtype).transpose(1, 2)                  # (B, T, H, C), rounded once


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O (section 3.2.2); with ``config.attention_bias`` each
    projection adds its bias before its one rounding (else the paper's, without bias: b_* None).

    Parameters: w_q, w_k (D, H, K), w_v (D, H, C), w_o (H, C, D); biases b_q, b_k (H, K), b_v (H, C), b_o (D,),
    each registered after its weight (``spec.schema``'s order). ``project_kv`` and ``forward`` are the two
    halves, so a decoder can cache keys/values: per step for self-attention, once per source for cross-attention.
    """

    def __init__(self, config: Config, params: dict[str, np.ndarray], name: str,
                 device: torch.device | str | None = None, *, native_bf16: bool = False):
        super().__init__()
        own = lambda p: parameter(config, params, f"{name}.{p}", device)  # noqa: E731
        bias = lambda p: own(p) if config.attention_bias else None  # noqa: E731
        self.w_q, self.b_q = own("w_q"), bias("b_q")
        self.w_k, self.b_k = own("w_k"), bias("b_k")
        self.w_v, self.b_v = own("w_v"), bias("b_v")
        self.w_o, self.b_o = own("w_o"), bias("b_o")
        self.native_bf16 = native_bf16

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(B, M, D) -> heads-major k (B, H, M, K), v (B, H, M, C), the KV cache's layout (transposed views)."""
        k = linear(x, self.w_k, self.b_k, native_bf16=self.native_bf16)         # (B, M, H, K)
        v = linear(x, self.w_v, self.b_v, native_bf16=self.native_bf16)         # (B, M, H, C)
        return k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, x: Tensor, kv: tuple[Tensor, Tensor], mask: Tensor) -> Tensor:
        """Queries from x (B, L, D) over kv (B, H, M, K), (B, H, M, C); mask (B, 1, L or 1, M) -> (B, L, D)."""
        q = linear(x, self.w_q, self.b_q, native_bf16=self.native_bf16)         # (B, L, H, K)
        o = scaled_dot_product_attention(q, *kv, mask)                          # (B, L, H, C)
        return linear(o, self.w_o, self.b_o, n_in=2, native_bf16=self.native_bf16)  # (B, L, D)


def activation(h: Tensor, name: str) -> Tensor:
    """The FFN's nonlinearity ``name`` (``spec.config.ACTIVATIONS``) of the rounded hidden units h (B, L, F):
    ReLU exact in h's dtype; the others computed in fp32 and rounded once to h's dtype (rule 2)."""
    if name == "relu":
        return torch.relu(h)
    if name in ("gelu", "gelu_tanh"):                                       # x Phi(x), exact (erf) or tanh's
        return F.gelu(h.float(), approximate="tanh" if name == "gelu_tanh" else "none").to(h.dtype)
    if name == "silu":                                                      # x sigmoid(x)
        return F.silu(h.float()).to(h.dtype)
    raise ValueError(f"unknown activation {name!r}")


class FeedForward(nn.Module):
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2 (equation 2; act the ``activation`` ``config.activation``: the
    paper's ReLU by default): (B, L, D) -> (B, L, D), hidden (B, L, F)."""

    def __init__(self, config: Config, params: dict[str, np.ndarray], name: str,
                 device: torch.device | str | None = None, *, native_bf16: bool = False):
        super().__init__()
        own = lambda p: parameter(config, params, f"{name}.{p}", device)  # noqa: E731
        self.w_1, self.b_1, self.w_2, self.b_2 = own("w_1"), own("b_1"), own("w_2"), own("b_2")  # (D, F) .. (D,)
        self.act, self.native_bf16 = config.activation, native_bf16

    def forward(self, x: Tensor) -> Tensor:
        h = activation(linear(x, self.w_1, self.b_1, native_bf16=self.native_bf16), self.act)  # (B, L, F)
        return linear(h, self.w_2, self.b_2, native_bf16=self.native_bf16)                    # (B, L, D)


class LayerNorm(nn.Module):
    """LayerNorm over D (Ba et al., 2016; rule 6) with ``scale`` and ``bias`` (D): statistics and normalisation
    in fp32, rounded once to ``x.dtype``; scale and bias enter in ``x.dtype`` (rule 0)."""

    def __init__(self, config: Config, params: dict[str, np.ndarray], name: str,
                 device: torch.device | str | None = None):
        super().__init__()
        self.scale = parameter(config, params, f"{name}.scale", device)        # (D,)
        self.bias = parameter(config, params, f"{name}.bias", device)          # (D,)
        self.eps = config.layer_norm_eps

    def forward(self, x: Tensor) -> Tensor:
        scale, bias = round_to(self.scale, x.dtype), round_to(self.bias, x.dtype)
        # Centred first, rule 6's first pass: F.layer_norm's CPU kernel takes Welford's running moments, whose fp32
        # mean is off by ~u * |mean|, thousands of fp32 ulps of the output where a row's mean dwarfs its spread; of
        # centred rows it takes the spread's moments, and it stays one fused kernel with its fused backward.
        x32 = x.float()
        centred = x32 - x32.mean(dim=-1, keepdim=True)                                              # (..., D)
        return F.layer_norm(centred, x.shape[-1:], scale, bias, self.eps).to(x.dtype)
