"""The Transformer's layers (Vaswani et al., 2017, section 3) under the numerics contract of ``spec.numerics``.

Shape letters: B batch, S source length, T target length, D d_model, H n_heads, K d_k, C d_v, F d_ff.
Queries are laid out (B, L, H, K); keys and values heads-major (B, H, L, K), the KV cache's layout
(``spec.api``): a cache write per step is a slice along L, and attention's per-head products and
``torch.nn.functional.scaled_dot_product_attention`` read them in place.

Rounding (contract rule 2): every product takes operands in the activation dtype, accumulates in fp32 and is
rounded to the activation dtype once, after its bias; ``project`` is the one place that does it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.weak import WeakIdKeyDictionary

from spec.config import Config
from spec.numerics import MASKED_SCORE
from spec.recording import record

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
logger = logging.getLogger("impl_torch")


def project(eq: str, x: Tensor, w: Tensor, bias: Tensor | None = None, out_dtype: torch.dtype | None = None) -> Tensor:
    """``einsum(eq, x, w) + bias``, accumulated in fp32 and rounded once to ``out_dtype`` (default ``x.dtype``).

    ``x`` is an activation; ``w`` and ``bias`` are cast to its dtype first (contract rule 0).

    On CUDA a bias-free bf16 product is a native bf16 GEMM: cuBLAS accumulates in fp32 and rounds once, provided
    ``allow_bf16_reduced_precision_reduction`` is off, as inside ``contract_numerics``. Everything else runs as an
    fp32 GEMM of the upcast operands: a product of two bf16 values is exact in fp32, so this is the same contract,
    with the bias added before the single rounding (cuBLAS's bf16 GEMM would round before the bias: twice). The
    fp32 copy of a parameter is kept while the parameter is unchanged (``as_float``), so a decode step does not
    upcast the weights again. ``linear``, which every parameter product but the output projection goes through,
    also runs native bf16 GEMMs on a CPU where they are faster (``native_bf16_gemm``).
    """
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if x.is_cuda and bias is None and x.dtype == out_dtype == torch.bfloat16:
        return torch.einsum(eq, x, w.to(x.dtype))  # parameters enter in the activation dtype (rule 0)
    y = torch.einsum(eq, x.float(), as_float(w, x.dtype))
    if bias is not None:
        y = y + as_float(bias, x.dtype)
    return y.to(out_dtype)


# Parameter -> (its state when copied, its fp32 copy): weak, so a copy lives no longer than its parameter.
_FLOAT_COPIES = WeakIdKeyDictionary()


def as_float(w: Tensor, dtype: torch.dtype) -> Tensor:
    """``w`` entering the computation in ``dtype`` (rule 0), as fp32: ``w.to(dtype).float()``, the same bits.

    For an ``nn.Parameter`` read while no gradient is recorded (``torch.no_grad``, ``torch.inference_mode``), the
    copy is made once and reused while the parameter is unchanged: the key is the parameter's version counter
    (bumped by every in-place write: optimiser steps, ``load_state_dict``, ``copy_``), storage, dtype and device,
    so a reused copy is always the one a fresh cast would give. While gradients are recorded the cast is done
    every time (``rounded``), so that it stays differentiable and training never reads a stale copy.
    """
    if w.dtype == dtype == torch.float32:
        return w
    if torch.is_grad_enabled() or not isinstance(w, nn.Parameter) or w.is_inference():
        return rounded(w, dtype)
    key = (w._version, w.data_ptr(), w.dtype, w.device, dtype)
    hit = _FLOAT_COPIES.get(w)
    if hit is None or hit[0] != key:
        hit = _FLOAT_COPIES[w] = (key, w.to(dtype).float())
    return hit[1]


def as_dtype(w: Tensor, dtype: torch.dtype) -> Tensor:
    """``w.to(dtype)`` (rule 0), kept for an unchanged ``nn.Parameter`` while no gradient is recorded, as
    ``as_float`` keeps its fp32 copies."""
    if w.dtype == dtype:
        return w
    if torch.is_grad_enabled() or not isinstance(w, nn.Parameter) or w.is_inference():
        return w.to(dtype)
    key = (w._version, w.data_ptr(), w.dtype, w.device, dtype, "cast")
    hit = _CASTS.get(w)
    if hit is None or hit[0] != key:
        hit = _CASTS[w] = (key, w.to(dtype))
    return hit[1]


_CASTS = WeakIdKeyDictionary()  # Parameter -> (its state when cast, the cast), as _FLOAT_COPIES

# CPU bf16 products: True runs them as native bf16 GEMMs, False as fp32 GEMMs of the upcast operands (the same
# contract either way, ``linear``); None (default) decides once per process by timing both (``native_bf16_gemm``).
NATIVE_BF16_GEMM: bool | None = None
NATIVE_MIN_SPEEDUP = 1.5  # the native GEMM must win by this much, so a close race cannot flip between processes


def native_bf16_gemm() -> bool:
    """Whether CPU bf16 products run as native bf16 GEMMs: ``NATIVE_BF16_GEMM`` if set, else measured once.

    Which is faster depends on the CPU, not on its flags: measured with torch 2.13 at (512, 512, 2048), native bf16
    ran 4.4x faster than fp32 on an AMD EPYC (Zen 5, avx512_bf16) and 0.6x as fast on an Intel Xeon that also
    reports avx512_bf16; without avx512_bf16 it is ~170x slower. Both give the contract's result: operands exact,
    fp32 accumulation, one rounding after the bias (checked by the conformance suite on whichever path runs).
    """
    if NATIVE_BF16_GEMM is not None:
        return NATIVE_BF16_GEMM
    return _native_bf16_measured()


@functools.cache
def _native_bf16_measured() -> bool:
    """Best of 5 timings of a (256, 512) x (512, 1024) product each way (a few milliseconds, once per process)."""
    a, b = torch.ones(256, 512, dtype=torch.bfloat16), torch.ones(512, 1024, dtype=torch.bfloat16)
    a32, b32 = a.float(), b.float()

    def best(f: Callable[[], Tensor]) -> float:
        times = []
        for _ in range(5):
            start = time.perf_counter()
            f()
            times.append(time.perf_counter() - start)
        return min(times)

    with torch.inference_mode():
        native, upcast = best(lambda: a @ b), best(lambda: a32 @ b32)
    choice = upcast >= NATIVE_MIN_SPEEDUP * native
    logger.info("impl_torch: CPU bf16 products as %s GEMMs (native bf16 %.2f ms, fp32 %.2f ms)",
                "native bf16" if choice else "fp32", native * 1e3, upcast * 1e3)
    return choice


class _Rounded(torch.autograd.Function):
    """``w.to(dtype).float()`` whose gradient passes through the rounding unchanged (``spec.training``)."""

    @staticmethod
    def forward(w: Tensor, dtype: torch.dtype) -> Tensor:
        return w.to(dtype).float()

    @staticmethod
    def setup_context(ctx, inputs: tuple[Tensor, torch.dtype], output: Tensor) -> None:
        ctx.w_dtype = inputs[0].dtype

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return grad.to(ctx.w_dtype), None


def rounded(w: Tensor, dtype: torch.dtype) -> Tensor:
    """``w`` rounded to ``dtype`` and held in fp32 (rule 0), the same values as ``w.to(dtype).float()``.

    Differentiable as a straight-through rounding: the fp32 gradient of the rounded weight is the gradient of an
    fp32 master ``w``, not rounded to ``dtype`` on its way back as autograd's own ``.to(dtype)`` would round it.
    """
    if w.requires_grad and torch.is_grad_enabled() and w.dtype != dtype:  # else autograd's cast rounds nothing
        return _Rounded.apply(w, dtype)
    return w.to(dtype).float()


class _NativeLinear(torch.autograd.Function):
    """x2 (rows, I) bf16 times a parameter w2 (I, O), plus bias (O,), for training: native bf16 GEMMs where the
    contract allows them, fp32 where it asks for fp32 (``spec.backward``'s docstring).

    Forward: the weight and bias rounded to bf16 (rule 0), one bf16 GEMM accumulating in fp32 and rounding once,
    after the bias (``linear``). Backward, given dy (rows, O) bf16 (the cotangent of a bf16 activation is bf16):
    dx = dy W^T, a bf16 cotangent, is the same kind of product, so a native bf16 GEMM too; dW = x^T dy and
    db = sum(dy) are parameter gradients, fp32 by the contract, so their products are exact and accumulated in
    fp32 with no bf16 rounding (``_fp32_product``). dW and db pass the bf16 rounding of the master weight
    unchanged (straight-through, as ``_Rounded``) and come back in the master's dtype.
    """

    @staticmethod
    def forward(ctx, x2: Tensor, w2: Tensor, bias: Tensor | None) -> Tensor:
        wb = w2.to(x2.dtype)                                                    # (I, O) bf16, rule 0
        ctx.save_for_backward(x2, wb)
        ctx.w_dtype, ctx.b_dtype = w2.dtype, None if bias is None else bias.dtype
        if bias is None:
            return x2 @ wb                                                      # (rows, O) bf16
        return torch.addmm(bias.to(x2.dtype), x2, wb)                           # (rows, O) bf16, bias before rounding

    @staticmethod
    def backward(ctx, dy: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x2, wb = ctx.saved_tensors                                              # (rows, I), (I, O) bf16
        need_x, need_w, need_b = ctx.needs_input_grad
        dx = dy @ wb.T if need_x else None                                      # (rows, I) bf16, rounded once
        dw = _fp32_product(x2.T, dy).to(ctx.w_dtype) if need_w else None        # (I, O) fp32, never bf16
        db = dy.sum(0, dtype=torch.float32).to(ctx.b_dtype) if need_b else None  # (O,) fp32 sum of exact values
        return dx, dw, db


def _fp32_product(a: Tensor, b: Tensor) -> Tensor:
    """a (M, K) @ b (K, N) of bf16 operands -> (M, N) fp32: exact products, fp32 accumulation, no bf16 rounding.

    On CUDA cuBLAS writes its fp32 accumulator out (``out_dtype``); on the CPU ``out_dtype`` is not implemented, so
    an fp32 GEMM of the upcast operands (exact: a bf16 value is an fp32 one). ``.float()`` keeps the strides, so
    dW = x^T dy is the fp32 path's own (autograd's ``mm`` backward: a transposed view of x times dy), bit for bit.
    """
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=torch.float32)                          # (M, N) fp32
    return a.float() @ b.float()                                                # (M, N) fp32


def linear(x: Tensor, w: Tensor, bias: Tensor | None = None, n_in: int = 1) -> Tensor:
    """``project`` for a parameter: x (..., *I) times w (*I, *O) over the last ``n_in`` axes of x, plus bias (*O)
    -> (..., *O) in ``x.dtype``, the same numerics as ``project``.

    One 2-D ``torch.mm`` of the flattened operands: for the few rows of a decode step it is faster than the
    batched product ``einsum`` makes of it, and it never copies the weight (a profile of ``base`` decode steps).
    Which GEMM runs for a bf16 ``x`` (fp32 activations always take the last, fp32, path):

    * CUDA, no bias: a native bf16 GEMM (cuBLAS accumulates in fp32 and rounds once, ``contract_numerics``).
    * CPU whose native bf16 GEMM is the faster one (``native_bf16_gemm``): ``torch.addmm``/``mm`` of bf16 operands;
      oneDNN accumulates in fp32 and adds the bias before its one rounding. Outside autograd the bf16 casts of an
      unchanged parameter are kept (``as_dtype``).
    * Either of these under autograd goes through ``_NativeLinear``, whose backward keeps the contract's dtypes: dx a
      native bf16 GEMM, dW and db fp32 (autograd's own backward of the bf16 product would round dW to bf16).
    * Otherwise (a CPU where native bf16 is slower, a CUDA product with a bias): an fp32 GEMM of the upcast
      operands (exact), the bias added in fp32, one rounding; autograd differentiates it in fp32 (``rounded``).
    """
    lead, n = x.shape[:x.dim() - n_in], math.prod(w.shape[:n_in])
    x2, w2 = x.reshape(-1, n), w.reshape(n, -1)                                 # (rows, I), (I, O)
    native = x.dtype == torch.bfloat16 and (bias is None if x.is_cuda else native_bf16_gemm())
    if native and torch.is_grad_enabled():
        y = _NativeLinear.apply(x2, w2, None if bias is None else bias.reshape(-1))  # (rows, O) bf16
    elif native:
        w2 = as_dtype(w, x.dtype).reshape(n, -1)                                # (I, O) bf16, kept while unchanged
        y = x2 @ w2 if bias is None else torch.addmm(as_dtype(bias, x.dtype).reshape(-1), x2, w2)  # (rows, O) bf16
    else:
        y = x2.float() @ as_float(w, x.dtype).reshape(n, -1)                    # (rows, O) fp32
        if bias is not None:
            y = y + as_float(bias, x.dtype).reshape(-1)
        y = y.to(x.dtype)
    return y.reshape(*lead, *w.shape[n_in:])


@contextlib.contextmanager
def contract_numerics() -> Iterator[None]:
    """A context in which PyTorch's matmul flags are what the contract needs on CUDA (rule 8); restored on exit.

    Inside: TF32 off for matmuls and cuDNN (``torch.backends.cuda.matmul.allow_tf32``,
    ``torch.backends.cudnn.allow_tf32``), and ``allow_bf16_reduced_precision_reduction`` off: by default it lets
    cuBLAS round partial sums of a bf16 GEMM to bf16, which breaks "accumulate in fp32, round once" (``project``).
    The flags are process-wide, so the library never sets them itself: run CUDA work that must meet the contract
    inside ``with impl_torch.contract_numerics(): ...``. On the CPU they change nothing.
    """
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (matmul.allow_tf32, cudnn.allow_tf32, matmul.allow_bf16_reduced_precision_reduction)
    matmul.allow_tf32 = cudnn.allow_tf32 = matmul.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32, matmul.allow_bf16_reduced_precision_reduction = before


# ----------------------------------------------------------------- dropout

class Dropout(nn.Dropout):
    """``nn.Dropout`` (section 5.4) that draws its masks from ``generator`` when one is set.

    ``impl_torch.train_step`` sets the train state's ``torch.Generator`` here for the step, so masks never come
    from (or advance) torch's global RNG; with none set it is plain ``nn.Dropout``. The identity in evaluation
    (rule 8).
    """

    generator: torch.Generator | None = None

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0 or self.generator is None:
            return super().forward(x)
        keep = 1.0 - self.p
        mask = torch.empty_like(x).bernoulli_(keep, generator=self.generator)   # x's shape, 1 = kept
        return x * mask / keep                                                  # inverted dropout, rounded once


# ----------------------------------------------------------------- embedding

def positional_encoding(length: int, d_model: int, device: torch.device | str | None = None) -> Tensor:
    """The sinusoidal table (section 3.5), (length, D) float32, interleaved, positions from 0.

    ``PE[pos, 2i] = sin(pos / 10000^(2i/D))``, ``PE[pos, 2i+1] = cos(...)``. Computed in float64 on the CPU
    (not every device has float64) and rounded once to float32.
    """
    pos = torch.arange(length, dtype=torch.float64)[:, None]           # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)           # (D/2,)
    angle = pos / 10000.0 ** (two_i / d_model)                         # (L, D/2)
    pe = torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1)    # (L, D): sin, cos interleaved
    return pe.to(device=device, dtype=torch.float32)


def embedding(table: Tensor, ids: Tensor, pe: Tensor, dtype: torch.dtype) -> Tensor:
    """``E[ids] * sqrt(D) + PE`` in fp32, rounded once to ``dtype`` (section 3.4, rule 3).

    table (V, D), ids (B, L) int64, pe (L, D) float32 -> (B, L, D) ``dtype``. Rows of the table enter in ``dtype``
    (rule 0).
    """
    x = rounded(F.embedding(ids, table), dtype) * math.sqrt(table.shape[-1])     # (B, L, D) fp32
    return (x + pe).to(dtype)


class Embedding(nn.Module):
    """Scaled token embedding plus positional encoding, then dropout (sections 3.4, 3.5, 5.4).

    The table is not a parameter of this module: it is the Transformer's single ``embedding`` (V, D), shared by
    source, target and the output projection, and passed to ``forward``. The PE table is a non-persistent fp32
    buffer of ``max_len`` rows.
    """

    def __init__(self, config: Config, device: torch.device | str | None = None):
        super().__init__()
        self.dtype = DTYPES[config.dtype]
        self.register_buffer("pe", positional_encoding(config.max_len, config.d_model, device), persistent=False)
        self.dropout = Dropout(config.dropout)

    def forward(self, table: Tensor, ids: Tensor, start: int = 0) -> Tensor:
        """ids (B, L) at positions start..start+L-1 -> (B, L, D) in the activation dtype."""
        return self.dropout(embedding(table, ids, self.pe[start:start + ids.shape[1]], self.dtype))


# ----------------------------------------------------------------- attention

def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, fused: bool = False) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) V (equation 1, rule 4), in the spec's layout.

    q (B, T, H, K), k (B, S, H, K), v (B, S, H, C), mask bool broadcastable to (B, H, T, S), True = may attend.
    Returns (B, T, H, C) in ``q.dtype``, the activation dtype. A query row whose keys are all masked gets a finite
    output. ``MultiHeadAttention`` calls ``attention`` on heads-major keys and values instead.
    """
    return attention(q, k.transpose(1, 2), v.transpose(1, 2), mask, fused)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, fused: bool = False) -> Tensor:
    """``scaled_dot_product_attention`` over heads-major k (B, H, S, K), v (B, H, S, C): -> (B, T, H, C).

    ``k`` and ``v`` are in ``q.dtype`` or are fp32 tensors holding values of it (the exact upcast the KV cache
    keeps on the CPU, ``KVCache``).

    The plain path (default) is the contract written out: fp32 scores, scaled in fp32, masked with
    ``MASKED_SCORE``, fp32 max-subtracted softmax, probabilities rounded to ``q.dtype`` before P V.
    ``fused=True`` calls ``torch.nn.functional.scaled_dot_product_attention``. Its CUDA
    kernels (flash, memory-efficient) keep scores and softmax in fp32 and round the *unnormalised* probabilities
    to bf16 before P V, normalising in fp32 after: one rounding per probability, as the contract asks, in a
    slightly different place. Its CPU kernel keeps the probabilities in fp32 (measured on the golden SDPA cases:
    0.5-0.7x the contract's error), so on CPU the plain path is the contract and the fused one is not. The mask
    becomes an additive bias of the dtype's most negative finite value, so fully masked rows stay finite.
    """
    dtype = q.dtype
    q = q.transpose(1, 2)                                                   # (B, H, T, K) view
    if fused:
        k, v = k.to(dtype), v.to(dtype)                                     # exact: values of ``dtype``
        bias = torch.zeros(mask.shape, dtype=dtype, device=q.device).masked_fill(~mask, torch.finfo(dtype).min)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0 / math.sqrt(q.shape[-1]))
        return o.transpose(1, 2)                                            # (B, T, H, C)
    # bf16 keys/values are upcast once, exactly (a product of two bf16 values is exact in fp32).
    scores = torch.matmul(q.float(), k.float().transpose(2, 3))             # (B, H, T, S) fp32, never rounded
    scores = scores * (1.0 / math.sqrt(q.shape[-1]))                        # scaled in fp32
    scores = scores.masked_fill(~mask, MASKED_SCORE)                        # masked keys get exactly zero weight
    probs = torch.softmax(scores, dim=-1).to(dtype)                        # fp32 softmax, rounded before P V
    o = torch.matmul(probs.float(), v.float())                              # (B, H, T, C) fp32 accumulation
    return o.to(dtype).transpose(1, 2)                                      # (B, T, H, C), rounded once


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O (section 3.2.2), projections without bias.

    Parameters: w_q, w_k (D, H, K), w_v (D, H, C), w_o (H, C, D). ``project_kv`` and ``attend`` are the two
    halves of ``forward``, so a decoder can cache keys/values: per step for self-attention, once per source for
    cross-attention. ``fused`` picks the attention path: None (default) runs fused on CUDA and plain elsewhere
    (``scaled_dot_product_attention`` says why); True or False forces one.
    """

    fused: bool | None = None

    def __init__(self, config: Config, device: torch.device | str | None = None):
        super().__init__()
        D, H, K, C = config.d_model, config.n_heads, config.d_k, config.d_v
        kw = {"dtype": DTYPES[config.param_dtype], "device": device}
        self.w_q = nn.Parameter(torch.empty(D, H, K, **kw))
        self.w_k = nn.Parameter(torch.empty(D, H, K, **kw))
        self.w_v = nn.Parameter(torch.empty(D, H, C, **kw))
        self.w_o = nn.Parameter(torch.empty(H, C, D, **kw))

    def project_kv(self, x_kv: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S, D) -> heads-major k (B, H, S, K), v (B, H, S, C), the KV cache's layout (transposed views)."""
        return linear(x_kv, self.w_k).transpose(1, 2), linear(x_kv, self.w_v).transpose(1, 2)

    def attend(self, x_q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """Queries x_q (B, T, D) over k (B, H, S, K), v (B, H, S, C); mask (B, 1, T or 1, S) -> (B, T, D)."""
        q = linear(x_q, self.w_q)                                               # (B, T, H, K)
        fused = q.is_cuda if self.fused is None else self.fused
        o = attention(q, k, v, mask, fused)                                     # (B, T, H, C)
        return linear(o, self.w_o, n_in=2)                                      # (B, T, D)

    def forward(self, x_q: Tensor, x_kv: Tensor, mask: Tensor) -> Tensor:
        """x_q (B, T, D), x_kv (B, S, D), mask bool (B, 1, T or 1, S) -> (B, T, D)."""
        return self.attend(x_q, *self.project_kv(x_kv), mask)


# ----------------------------------------------------------------- FFN, norm, residual

class FeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (equation 2): (B, L, D) -> (B, L, D), hidden (B, L, F)."""

    def __init__(self, config: Config, device: torch.device | str | None = None):
        super().__init__()
        D, F_ = config.d_model, config.d_ff
        kw = {"dtype": DTYPES[config.param_dtype], "device": device}
        self.w_1 = nn.Parameter(torch.empty(D, F_, **kw))
        self.b_1 = nn.Parameter(torch.empty(F_, **kw))
        self.w_2 = nn.Parameter(torch.empty(F_, D, **kw))
        self.b_2 = nn.Parameter(torch.empty(D, **kw))

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(linear(x, self.w_1, self.b_1))   # (B, L, F), ReLU commutes with rounding
        return linear(h, self.w_2, self.b_2)            # (B, L, D)


def layer_norm(x: Tensor, scale: Tensor, bias: Tensor, eps: float) -> Tensor:
    """LayerNorm over D (Ba et al., 2016): statistics and normalisation in fp32, rounded once to ``x.dtype``;
    ``scale`` and ``bias`` enter in ``x.dtype`` (rule 0)."""
    scale, bias = as_float(scale, x.dtype), as_float(bias, x.dtype)
    return F.layer_norm(x.float(), x.shape[-1:], scale, bias, eps).to(x.dtype)


class LayerNorm(nn.Module):
    """LayerNorm with ``scale`` and ``bias`` (D), rule 6; the final norm of a pre-LN stack."""

    def __init__(self, config: Config, device: torch.device | str | None = None):
        super().__init__()
        kw = {"dtype": DTYPES[config.param_dtype], "device": device}
        self.scale = nn.Parameter(torch.empty(config.d_model, **kw))
        self.bias = nn.Parameter(torch.empty(config.d_model, **kw))
        self.eps = config.layer_norm_eps

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm(x, self.scale, self.bias, self.eps)


class SublayerConnection(LayerNorm):
    """The residual connection around a sublayer, with its LayerNorm (sections 3.1, 5.4).

    Post-LN (the paper): ``LayerNorm(x + Dropout(Sublayer(x)))``; pre-LN (``config.norm_first``):
    ``x + Dropout(Sublayer(LayerNorm(x)))``. It is the norm itself (a ``LayerNorm`` subclass) so that the norm's
    parameters keep their canonical names, ``{layer}.{sublayer}_norm.scale`` and ``.bias``.
    """

    def __init__(self, config: Config, device: torch.device | str | None = None):
        super().__init__(config, device)
        self.norm_first = config.norm_first
        self.dropout = Dropout(config.dropout)

    def add_norm(self, x: Tensor, y: Tensor) -> Tensor:
        """``LayerNorm(x + y)``, the residual add rounded first (rules 5, 6): the post-LN block given y."""
        return layer_norm(x + y, self.scale, self.bias, self.eps)

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor], name: str = "") -> Tensor:
        """x (B, L, D) -> (B, L, D). Records the sublayer's output as ``name``, the block's as ``name.residual``."""
        if self.norm_first:
            y = record(name, sublayer(layer_norm(x, self.scale, self.bias, self.eps)))
            out = x + self.dropout(y)
        else:
            y = record(name, sublayer(x))
            out = self.add_norm(x, self.dropout(y))
        return record(f"{name}.residual", out)


# ----------------------------------------------------------------- layers

class EncoderLayer(nn.Module):
    """Self-attention then FFN, each in a sublayer connection (section 3.1): (B, S, D) -> (B, S, D)."""

    def __init__(self, config: Config, device: torch.device | str | None = None):
        super().__init__()
        self.self_attn = MultiHeadAttention(config, device)
        self.self_attn_norm = SublayerConnection(config, device)
        self.ffn = FeedForward(config, device)
        self.ffn_norm = SublayerConnection(config, device)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x (B, S, D), mask (B, 1, 1, S) key padding mask. Records names relative to the layer (the stack scopes)."""
        x = self.self_attn_norm(x, lambda h: self.self_attn(h, h, mask), "self_attn")
        return self.ffn_norm(x, self.ffn, "ffn")


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder output, FFN (section 3.1): (B, n, D) -> (B, n, D)."""

    def __init__(self, config: Config, device: torch.device | str | None = None):
        super().__init__()
        self.self_attn = MultiHeadAttention(config, device)
        self.self_attn_norm = SublayerConnection(config, device)
        self.cross_attn = MultiHeadAttention(config, device)
        self.cross_attn_norm = SublayerConnection(config, device)
        self.ffn = FeedForward(config, device)
        self.ffn_norm = SublayerConnection(config, device)

    def forward(self, y: Tensor, memory_kv: tuple[Tensor, Tensor], memory_mask: Tensor, self_mask: Tensor,
                append_kv: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None) -> Tensor:
        """n new positions y (B, n, D) -> (B, n, D).

        memory_kv: this layer's cross-attention keys/values of the encoder output (``cross_attn.project_kv``),
        memory_mask (B, 1, 1, S); self_mask (B, 1, n, t) over the t self-attention keys. ``append_kv(k, v)`` is
        the KV cache: it stores the new positions' keys/values and returns those of all t positions so far
        (without it, the n new positions attend among themselves, t = n). Records names relative to the layer.
        """
        def self_attn(h: Tensor) -> Tensor:
            k, v = self.self_attn.project_kv(h)                                 # (B, H, n, K), (B, H, n, C)
            if append_kv is not None:
                k, v = append_kv(k, v)                                          # (B, H, t, K), (B, H, t, C)
            return self.self_attn.attend(h, k, v, self_mask)

        y = self.self_attn_norm(y, self_attn, "self_attn")
        y = self.cross_attn_norm(y, lambda h: self.cross_attn.attend(h, *memory_kv, memory_mask), "cross_attn")
        return self.ffn_norm(y, self.ffn, "ffn")
