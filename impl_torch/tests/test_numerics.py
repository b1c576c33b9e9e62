"""``impl_torch.numerics.round_to``: the straight-through bf16 rounding of an fp32 master weight (``spec.training``)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from impl_torch.numerics import round_to


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


class _OpCensus(TorchDispatchMode):
    """Records every aten operator run inside it."""

    def __init__(self):
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))
