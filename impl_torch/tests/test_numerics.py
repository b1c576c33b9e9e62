"""``impl_torch.numerics``: the products' rounding points (``linear``, ``logits``) on either CPU GEMM path
(``native_bf16``), the straight-through bf16 rounding of an fp32 master weight (``round_to``, ``spec.training``), and
the process-wide flags of ``numerics_scope``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import impl_torch
from impl_torch.numerics import linear, round_to
from spec import TINY
from spec.numerics import BF16


def _bf16(*shape, seed=0, scale=1.0):
    return (scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))).bfloat16()


def test_rounding_passes_the_gradient_through_in_fp32():
    """The bf16 rounding of an fp32 master weight: straight-through, the fp32 gradient not rounded to bf16."""
    w = torch.tensor([1.0 + 2.0 ** -12], requires_grad=True)
    g_out = torch.tensor([1.0 + 2.0 ** -20])                             # not a bf16 value
    (round_to(w, torch.bfloat16) * g_out).sum().backward()
    assert w.grad.item() == g_out.item()


def test_rounding_is_bit_exact_and_casts_nothing_backward():
    """The straight-through rounding gives the cast's bits forward (-0, a negative subnormal rounding to -0, an
    overflow to inf) and runs no cast backward: the gradient is handed on, negated twice at most."""
    w = torch.tensor([1.0 + 2.0 ** -12, -3.0 - 2.0 ** -10, -0.0, -1e-45, 3.4e38], requires_grad=True)
    r = round_to(w, torch.bfloat16)
    assert torch.equal(r.view(torch.int32), w.detach().to(torch.bfloat16).float().view(torch.int32))  # the bits
    g_out = torch.tensor([1.0 + 2.0 ** -20, -2.0 ** -30, 1.0, 1.0, 1.0])
    with _OpCensus() as census:
        (g,) = torch.autograd.grad(r, w, g_out)
    assert set(census.ops) <= {torch.ops.aten.neg.default} and len(census.ops) <= 2 and torch.equal(g, g_out)


def test_linear_accumulates_in_fp32_and_rounds_once_after_the_bias():
    x, w, b = _bf16(3, 4, 64, seed=1), _bf16(64, 16, seed=2), _bf16(16, seed=3)
    y = linear(x, w, b)
    exact = np.einsum("bld,df->blf", x.double().numpy(), w.double().numpy()) + b.double().numpy()
    once = exact.astype(np.float32).astype(BF16)                           # fp32 accumulator, one bf16 rounding
    assert y.dtype == torch.bfloat16
    # fp32 summation order may move a result across a bf16 rounding boundary only when it lies within ~2^-16 ulp
    differ = (impl_torch.to_array(y) != once).mean()
    assert differ < 0.01, f"{differ:.1%} of results differ from one rounding of the exact value"


def _flags():
    return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction)


def test_numerics_scope_sets_the_flags_and_restores_them():
    before = _flags()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        with impl_torch.numerics_scope():
            assert _flags() == (False, False, False)
        assert _flags() == (True, True, before[2])
        with pytest.raises(RuntimeError, match="inside"), impl_torch.numerics_scope():
            raise RuntimeError("inside")
        assert _flags() == (True, True, before[2])                          # restored on an exception too
    finally:
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
         torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction) = before


@pytest.mark.parametrize("native", [False, True], ids=["fp32_gemm", "native_bf16_gemm"])
def test_building_running_and_training_a_model_changes_no_flag(native, ids):
    mkldnn = torch.backends.mkldnn
    before = (_flags(), mkldnn.fp32_precision, mkldnn.matmul.fp32_precision)
    model = impl_torch.Transformer(TINY, native_bf16=native)
    impl_torch.greedy_search(model, ids(0, 1, 4), max_new_tokens=3)
    src, tgt = ids(1, 2, 5), ids(2, 2, 4, bos=True)
    impl_torch.train_step(model, impl_torch.init_train_state(model), src, tgt, tgt)
    assert (_flags(), mkldnn.fp32_precision, mkldnn.matmul.fp32_precision) == before


def test_native_logits_are_the_fp32_product_of_the_bf16_operands():
    """``logits`` with ``native_bf16`` (oneDNN's bf16 GEMM with an fp32 result): fp32, never rounded to bf16, and
    within fp32 accumulation of the exact product of the bf16 operands, as the default fp32 GEMM is."""
    x, table = _bf16(4, 16, 512, seed=5), _bf16(1000, 512, seed=6).float()               # the table as it enters
    exact = x.double() @ table.double().T                                                 # (4, 16, 1000)
    size = x.double().abs() @ table.double().abs().T
    for native in (False, True):
        got = impl_torch.numerics.logits(x, table, native_bf16=native)
        assert got.dtype == torch.float32 and not torch.equal(got, got.bfloat16().float())
        assert ((got.double() - exact).abs() <= 2.0 ** -18 * size).all()


@pytest.mark.parametrize("native", [False, True], ids=["fp32_gemm", "native_bf16_gemm"])
def test_cpu_bf16_linear_rounds_once_after_the_bias_on_either_path(native):
    """Both CPU paths of ``linear`` (``native_bf16``) compute round(x W + b) with fp32 accumulation: only the
    fp32 summation order may flip a rounding, never the double rounding a bias added after the product would make
    (which changes ~30% of the results)."""
    x, w, b = _bf16(64, 256, seed=1), _bf16(256, 384, seed=2, scale=256 ** -0.5), _bf16(384, seed=3)
    with torch.inference_mode():
        got = linear(x, torch.nn.Parameter(w, requires_grad=False), b, native_bf16=native)  # (64, 384) bf16
    want = (x.double() @ w.double() + b.double()).float().bfloat16()                      # rounded once
    assert got.dtype == torch.bfloat16
    assert (got != want).float().mean() < 1e-3
    assert ((got.double() - want.double()).abs() <= want.double().abs() * 2.0 ** -7).all()  # at most one ulp


def _linear_and_grads(native: bool, x, w, b, dy) -> tuple[torch.Tensor, ...]:
    """y = ``linear(x, w, b)`` under autograd on the native (True) or fp32 (False) CPU path, and dx, dw, db."""
    x, w, b = (t.detach().clone().requires_grad_() for t in (x, w, b))
    y = linear(x, w, b, native_bf16=native)                                               # (rows, O) bf16
    assert (type(y.grad_fn.next_functions[0][0]).__name__ == "_NativeLinearBackward") == native  # under a view
    return (y.detach(), *torch.autograd.grad(y, (x, w, b), dy))


def test_cpu_bf16_linear_training_paths_agree():
    """The two CPU training paths of ``linear``: native bf16 GEMMs (``_NativeLinear``) and fp32 GEMMs of the upcast
    operands (autograd through ``round_to``). db is the same bits; dW is an fp32 product of the exact bf16 operands
    on both (oneDNN's bf16 GEMM with an fp32 result on the native path: another fp32 summation order), not rounded
    to bf16, passed straight through the weight's bf16 rounding; a bf16 master gets it rounded once. y and dx, each
    rounded once from an fp32 accumulator on both paths, differ only where the two GEMMs' fp32 summation orders
    differ by more than the result's bf16 ulp: results that cancel heavily (|x W| far below |x| |W|), a few in
    10^4, each within one rounding of an fp32 sum of the exact value."""
    x, dy = _bf16(256, 512, seed=1), _bf16(256, 1024, seed=4)                             # (rows, I), (rows, O)
    w = 512 ** -0.5 * torch.randn(512, 1024, generator=torch.Generator().manual_seed(2))   # (I, O) fp32 master
    b = torch.randn(1024, generator=torch.Generator().manual_seed(3))                     # (O,) fp32 master
    fp32, native = _linear_and_grads(False, x, w, b, dy), _linear_and_grads(True, x, w, b, dy)
    y, dx, dw, db = native
    assert y.dtype == dx.dtype == torch.bfloat16 and dw.dtype == db.dtype == torch.float32
    assert torch.equal(db, fp32[3]) and torch.equal(db, dy.float().sum(0))
    exact_dw, size_dw = x.double().T @ dy.double(), x.double().abs().T @ dy.double().abs()
    for v in (dw, fp32[2]):                                                                # fp32 accumulation
        assert ((v.double() - exact_dw).abs() <= 2.0 ** -18 * size_dw).all()
    assert not torch.equal(dw, dw.bfloat16().float())                                    # fp32, not bf16 values
    w16, b16 = w.bfloat16(), b.bfloat16()
    for master in (w16.float(), w16):  # straight-through: the bf16 weight's gradient, in the master's dtype
        got = _linear_and_grads(True, x, master, b16.to(master.dtype), dy)
        assert torch.equal(got[0], y) and torch.equal(got[1], dx)
        assert got[2].dtype == master.dtype and torch.equal(got[2], dw.to(master.dtype))
    exact_y, size_y = x.double() @ w16.double() + b16.double(), x.double().abs() @ w16.double().abs() + b16.abs()
    exact_dx, size_dx = dy.double() @ w16.double().T, dy.double().abs() @ w16.double().abs().T
    for got, want, exact, size in ((y, fp32[0], exact_y, size_y), (dx, fp32[1], exact_dx, size_dx)):
        assert (got != want).float().mean() < 1e-3                                         # a few in 10^4
        for v in (got.double(), want.double()):  # |round(s) - s| <= 2^-8 |s|, |s - exact| <= a few 2^-24 sum |t|
            assert ((v - exact).abs() <= 2.0 ** -8 * exact.abs() + 2.0 ** -18 * size).all()


class _OpCensus(TorchDispatchMode):
    """Records every aten operator run inside it."""

    def __init__(self):
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))
