"""Greedy and beam search: output form, batching, and agreement with spec.search on a float32 model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import impl_torch
from spec import reference as ref
from spec import search
from spec.config import TINY
from spec.golden_cases import EOS_BOOST, make_params
from spec.numerics import Numerics

C32 = TINY.replace(dtype="float32", param_dtype="float32")


@pytest.fixture(scope="module")
def model32():
    return impl_torch.from_params(C32, make_params(C32, 101, EOS_BOOST))


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_same_tokens_as_spec_search(kind, model32, ids):
    """The float32 model's decisions match the reference's (spec.search) on these inputs."""
    src = ids(20, 3, 6)
    src[1, 4:] = C32.pad_id
    P = ref.as_float64(impl_torch.params_of(model32), C32)
    if kind == "greedy":
        want = search.greedy_search(P, src.numpy(), C32, Numerics("float32"), max_new_tokens=12)
        got = impl_torch.greedy_search(model32, src, max_new_tokens=12)
    else:
        want = search.beam_search(P, src.numpy(), C32, Numerics("float32"), max_new_tokens=12)
        got = impl_torch.beam_search(model32, src, max_new_tokens=12)
    np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_each_row_decodes_as_if_alone(kind, model32, ids):
    src = ids(21, 3, 7)
    src[2, 3:] = C32.pad_id
    run = impl_torch.greedy_search if kind == "greedy" else impl_torch.beam_search
    batch = run(model32, src)
    for b in range(3):
        alone = run(model32, src[b:b + 1])[0]
        np.testing.assert_array_equal(batch[b, :len(alone)].numpy(), alone.numpy())
        assert (batch[b, len(alone):] == C32.pad_id).all()


def test_output_stops_at_eos_or_the_limit(model32, ids):
    src = ids(22, 4, 5)
    for out in (impl_torch.greedy_search(model32, src), impl_torch.beam_search(model32, src, beam_size=3)):
        assert out.dtype == torch.long and out.shape[0] == 4 and out.shape[1] <= 5 + 50
        for row in out:
            eos = (row == C32.eos_id).nonzero()
            end = int(eos[0]) + 1 if len(eos) else len(row)
            assert (row[end:] == C32.pad_id).all()


def test_bad_generation_arguments(ids):
    m = impl_torch.from_params(C32, make_params(C32, 1))
    src = ids(23, 1, 4)
    with pytest.raises(ValueError, match="max_new_tokens must be a positive int"):
        impl_torch.greedy_search(m, src, max_new_tokens=0)
    with pytest.raises(ValueError, match="beam_size must be a positive int"):
        impl_torch.beam_search(m, src, beam_size=0)
    with pytest.raises(ValueError, match="generation may need 100 target positions but max_len is 64"):
        impl_torch.beam_search(m, src, max_new_tokens=100)
