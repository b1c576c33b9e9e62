"""Greedy and beam search: the spec's algorithm and tie rules, per-sequence limits, one compilation per shape."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import impl_jax
from impl_jax import generate
from spec import search
from spec.config import TINY
from spec.init import init_params
from spec.numerics import Numerics

MAX_NEW = 8  # every test here shares the compiled shapes: src (3, 7), capacity 8


def decoding_case(seed: int, tokens):
    """A float32 tiny model whose E[eos] is doubled (as the golden decoding cases do) so that some
    hypotheses end, and a batch of 3 sources (one padded: per-sequence limits differ)."""
    c = TINY.replace(dtype="float32", param_dtype="float32")
    flat = init_params(c, seed, observable=True)
    flat["embedding"][c.eos_id] *= 2.0
    src = tokens(c, 11, 3, 7)
    src[1, 3:] = c.pad_id
    return c, {k: v.astype(np.float64) for k, v in flat.items()}, impl_jax.to_tree(flat), src


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from([-np.inf, -1.0, 0.0, 0.5, 2.0]), min_size=8, max_size=300), st.integers(1, 8))
def test_top_k_breaks_ties_toward_the_lower_index(values, k):
    """``lax.top_k`` orders equal values by ascending index: the spec's stable descending sort."""
    x = np.asarray(values, np.float32)
    _, idx = lax.top_k(jnp.asarray(x), k)
    np.testing.assert_array_equal(np.asarray(idx), np.argsort(-x, kind="stable")[:k])


def test_greedy_matches_the_spec(tokens):
    c, exact, params, src = decoding_case(3, tokens)   # rows end at EOS or at the limit
    trace = {}
    want = search.greedy_search(exact, src, c, Numerics(c.dtype), MAX_NEW, trace)
    assert trace["margin"] > 1e-4, "the case is too close to a tie to compare decisions"
    assert (want == c.eos_id).any() and not (want == c.eos_id).any(axis=1).all()
    np.testing.assert_array_equal(np.asarray(impl_jax.greedy_search(params, c, src, MAX_NEW)), want)


@pytest.mark.parametrize("alpha", [0.6, 0.0])
def test_beam_matches_the_spec(alpha, tokens):
    c, exact, params, src = decoding_case(2, tokens)   # two rows finish early, one falls back to its best alive
    trace = {}
    want = search.beam_search(exact, src, c, Numerics(c.dtype), 4, alpha, MAX_NEW, trace)
    assert trace["margin"] > 1e-4, "the case is too close to a tie to compare decisions"
    assert (want == c.eos_id).any() and not (want == c.eos_id).any(axis=1).all()
    np.testing.assert_array_equal(np.asarray(impl_jax.beam_search(params, c, src, 4, alpha, MAX_NEW)), want)


def test_generation_compiles_once_per_shape(tokens):
    c, _, params, src = decoding_case(2, tokens)
    before = generate._greedy._cache_size(), generate._beam._cache_size()
    for seed in range(3):                                   # other tokens, other per-sequence limits, other alpha
        other = tokens(c, seed, 3, 7)
        other[seed % 2, 2 + seed:] = c.pad_id
        impl_jax.greedy_search(params, c, other, MAX_NEW)
        impl_jax.beam_search(params, c, other, 4, 0.3 * seed, MAX_NEW)
    after = generate._greedy._cache_size(), generate._beam._cache_size()
    assert all(a >= 1 and a - b <= 1 for a, b in zip(after, before, strict=True)), (before, after)


def test_output_form_and_limits(tokens):
    c, _, params, src = decoding_case(3, tokens)
    out = np.asarray(impl_jax.greedy_search(params, c, src, MAX_NEW))
    assert out.dtype == np.int32 and out.shape[0] == 3 and out.shape[1] <= MAX_NEW
    for row in out:
        eos = np.flatnonzero(row == c.eos_id)
        if eos.size:
            assert (row[eos[0] + 1:] == c.pad_id).all()
