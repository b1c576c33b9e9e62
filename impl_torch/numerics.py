"""How impl_torch computes a product under the numerics contract of ``spec.numerics``, fenced in one file.

Every parameter product takes its operands in the activation dtype, accumulates in fp32 and is rounded to the
activation dtype once, after its bias (contract rule 2). Which GEMM does it is a pure function of the inputs and
one explicit option, ``native_bf16`` (``Transformer(..., native_bf16=False)``): on the CPU, bf16 products run as
fp32 GEMMs of the upcast operands (the default: exact operands, one rounding, on every CPU) or, with the option,
as native bf16 GEMMs (oneDNN accumulates in fp32 and adds the bias before its one rounding); with the option, the
products of bf16 operands whose result stays fp32 (the logits, a weight's gradient) run as oneDNN bf16 GEMMs with
an fp32 result. Both meet the contract; they may differ in the fp32 summation order. ``docs/decisions-torch.md``
has the measurements.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
from torch import Tensor


def round_to(p: Tensor, dtype: torch.dtype) -> Tensor:
    """``p`` entering the computation in ``dtype`` (rule 0), held in fp32: ``p.to(dtype).float()``, the same bits.

    Differentiable as a straight-through rounding (``spec.training``): the fp32 gradient of the rounded weight is
    the gradient of an fp32 master ``p``, not rounded to ``dtype`` on its way back as autograd's ``.to`` would.
    """
    if p.requires_grad and torch.is_grad_enabled() and p.dtype != dtype:  # else autograd's cast rounds nothing
        p0 = p.detach()
        # r - (p0 - p) is r bit for bit (p0 - p is +0, and x - +0 is x, -0 included); p - (p0 - r) would save the
        # backward's two negations but turns a negative subnormal that rounds to -0 into +0.
        return p0.to(dtype).float() - (p0 - p)
    return p.to(dtype).float()


def linear(x: Tensor, w: Tensor, bias: Tensor | None = None, *, n_in: int = 1, native_bf16: bool = False
           ) -> Tensor:
    """x (..., *I) times a parameter w (*I, *O) over the last ``n_in`` axes of x, plus bias (*O) -> (..., *O) in
    ``x.dtype``: fp32 accumulation, one rounding after the bias (rule 2).

    One 2-D GEMM of the flattened operands (for the few rows of a decode step it beats the batched product of
    ``einsum`` and never copies the weight). For a bf16 ``x``:

    * CUDA, no bias: a native bf16 GEMM (cuBLAS accumulates in fp32 and rounds once, ``numerics_scope``).
    * CPU with ``native_bf16``: ``torch.mm``/``addmm`` of bf16 operands, the bias added before the one rounding.
    * Either of these under autograd goes through ``_NativeLinear``, whose backward keeps the contract's dtypes.
    * Otherwise (the CPU default, a CUDA product with a bias, fp32 activations): an fp32 GEMM of the upcast
      operands (exact), the bias added in fp32, one rounding; autograd differentiates it in fp32 (``round_to``).
    """
    lead, n = x.shape[:x.dim() - n_in], math.prod(w.shape[:n_in])
    x2, w2 = x.reshape(-1, n), w.reshape(n, -1)                                 # (rows, I), (I, O)
    b = None if bias is None else bias.reshape(-1)                              # (O,)
    native = x.dtype == torch.bfloat16 and (bias is None if x.is_cuda else native_bf16)
    if native and torch.is_grad_enabled():
        y = _NativeLinear.apply(x2, w2, b)                                      # (rows, O) bf16
    elif native:
        wb = w2.to(x.dtype)                                                     # (I, O) bf16, rule 0
        y = x2 @ wb if b is None else torch.addmm(b.to(x.dtype), x2, wb)        # (rows, O) bf16, rounded once
    else:
        y = x2.float() @ round_to(w, x.dtype).reshape(n, -1)                    # (rows, O) fp32
        if b is not None:
            y = y + round_to(bias, x.dtype).reshape(-1)
        y = y.to(x.dtype)
    return y.reshape(*lead, *w.shape[n_in:])


class _NativeLinear(torch.autograd.Function):
    """x2 (rows, I) bf16 times a parameter w2 (I, O), plus bias (O,), for training: native bf16 GEMMs where the
    contract allows them, fp32 where it asks for fp32 (``spec.backward``).

    Forward: weight and bias rounded to bf16 (rule 0), one bf16 GEMM accumulating in fp32, rounded once after
    the bias. Backward, given dy (rows, O) bf16: dx = dy W^T, a bf16 cotangent, is the same kind of product;
    dW = x^T dy and db = sum(dy) are parameter gradients, fp32 by the contract, accumulated in fp32 with no bf16
    rounding, passed straight through the master weight's bf16 rounding (as ``round_to``).
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
        # dW (I, O) fp32, never bf16: cuBLAS writes its fp32 accumulator out; the CPU has no ``out_dtype``, so an fp32
        # GEMM of the exact upcast operands, which oneDNN runs as a bf16 GEMM with an fp32 result.
        if need_w and dy.is_cuda:
            dw = torch.mm(x2.T, dy, out_dtype=torch.float32).to(ctx.w_dtype)
        else:
            with torch.backends.mkldnn.flags(None, None, None, "bf16"):        # exact operands: an fp32 result
                dw = (x2.T.float() @ dy.float()).to(ctx.w_dtype) if need_w else None
        db = dy.sum(0, dtype=torch.float32).to(ctx.b_dtype) if need_b else None  # (O,) fp32 sum of exact values
        return dx, dw, db


def logits(x: Tensor, table: Tensor, bias: Tensor | None = None, *, native_bf16: bool = False) -> Tensor:
    """The tied output product x E^T (section 3.4, rule 7), plus ``bias``: x (B, T, D), table (V, D) and bias (V,)
    fp32 holding ``x.dtype`` values (rule 0: ``round_to``) -> (B, T, V) float32, never rounded. One 2-D fp32 GEMM
    of the exact upcast operands, the bias added to its fp32 result; for a bf16 ``x`` on the CPU with
    ``native_bf16``, run by oneDNN as a bf16 GEMM with an fp32 accumulator and result: PyTorch's ``mkldnn.flags``
    scoped around it (restored on exit; autograd's backward runs outside, in fp32). Its operands are bf16 values,
    so it rounds nothing."""
    native = native_bf16 and x.dtype == torch.bfloat16 and not x.is_cuda
    x2 = x.reshape(-1, x.shape[-1]).float()                                     # (rows, D) fp32
    with torch.backends.mkldnn.flags(None, None, None, "bf16") if native else contextlib.nullcontext():
        y = x2 @ table.T if bias is None else torch.addmm(bias, x2, table.T)    # (rows, V) fp32
    return y.reshape(*x.shape[:-1], -1)


def matmul_f32(a: Tensor, b: Tensor) -> Tensor:
    """a (..., M, K) @ b (..., K, N) of activations -> (..., M, N) fp32: exact upcast operands (a product of two
    bf16 values is exact in fp32), fp32 accumulation, never rounded (rule 4: scores, P V)."""
    return torch.matmul(a.float(), b.float())


@contextlib.contextmanager
def numerics_scope() -> Iterator[None]:
    """A context in which PyTorch's matmul flags are what the contract needs on CUDA (rule 8); restored on exit.

    Inside: TF32 off for matmuls and cuDNN, and ``allow_bf16_reduced_precision_reduction`` off (by default it lets
    cuBLAS round partial sums of a bf16 GEMM to bf16, against "accumulate in fp32, round once"). The flags are
    process-wide, so the library never sets them itself: run CUDA work inside ``with numerics_scope(): ...``.
    On the CPU they change nothing.
    """
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (matmul.allow_tf32, cudnn.allow_tf32, matmul.allow_bf16_reduced_precision_reduction)
    matmul.allow_tf32 = cudnn.allow_tf32 = matmul.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32, matmul.allow_bf16_reduced_precision_reduction = before
