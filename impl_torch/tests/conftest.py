"""Shared fixtures: small models with the golden cases' observable initialisation (every bias and scale visible)."""

from __future__ import annotations

import pytest
import torch

import impl_torch
from spec import TINY
from spec.golden_cases import make_params


@pytest.fixture(scope="session")
def tiny():
    """``tiny(dtype="bfloat16", **config_changes)``: a tiny model in eval mode."""
    def make(dtype: str = "bfloat16", **changes) -> impl_torch.Transformer:
        c = TINY.replace(dtype=dtype, param_dtype=dtype, **changes)
        return impl_torch.from_params(c, make_params(c, 5))
    return make


@pytest.fixture(scope="session", params=["bfloat16", "float32"])
def model(request, tiny) -> impl_torch.Transformer:
    return tiny(request.param)


@pytest.fixture(scope="session")
def ids():
    """``ids(seed, B, L, bos=False)``: random non-special token ids (B, L), the first one BOS if ``bos``."""
    def make(seed: int, B: int, L: int, bos: bool = False) -> torch.Tensor:
        x = torch.randint(3, TINY.vocab_size, (B, L), generator=torch.Generator().manual_seed(seed))
        if bos:
            x[:, 0] = TINY.bos_id
        return x
    return make
