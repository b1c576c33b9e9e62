"""Greedy and beam search: the spec's algorithm and tie rules, per-sequence limits, NumPy int64 results,
one compilation per shape bucket."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import impl_jax
from spec import search
from spec.config import TINY
from spec.init import init_params
from spec.numerics import Numerics

MAX_NEW = 8  # every test here shares the compiled shapes: src (3, 7) on buckets (4, 8), capacity 8


def decoding_case(seed: int, tokens):
    """A float32 tiny model whose E[eos] is doubled (as the golden decoding cases do) so that some
    hypotheses end, and a batch of 3 sources (one padded: per-sequence limits differ)."""
    c = TINY.replace(dtype="float32", param_dtype="float32")
    flat = init_params(c, seed, observable=True)
    flat["embedding"][c.eos_id] *= 2.0
    src = tokens(c, 11, 3, 7)
    src[1, 3:] = c.pad_id
    return c, {k: v.astype(np.float64) for k, v in flat.items()}, impl_jax.from_params(c, flat), src


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from([-np.inf, -1.0, 0.0, 0.5, 2.0]), min_size=8, max_size=300), st.integers(1, 8))
def test_top_k_breaks_ties_toward_the_lower_index(values, k):
    """``lax.top_k`` orders equal values by ascending index: the spec's stable descending sort."""
    x = np.asarray(values, np.float32)
    _, idx = lax.top_k(jnp.asarray(x), k)
    np.testing.assert_array_equal(np.asarray(idx), np.argsort(-x, kind="stable")[:k])


def test_greedy_matches_the_spec(tokens):
    c, exact, model, src = decoding_case(3, tokens)   # rows end at EOS or at the limit
    trace = {}
    want = search.greedy_search(exact, src, c, Numerics(c.dtype), MAX_NEW, trace)
    assert trace["margin"] > 1e-4, "the case is too close to a tie to compare decisions"
    assert (want == c.eos_id).any() and not (want == c.eos_id).any(axis=1).all()
    np.testing.assert_array_equal(impl_jax.greedy_search(model, src, MAX_NEW), want)


@pytest.mark.parametrize("alpha", [0.6, 0.0])
def test_beam_matches_the_spec(alpha, tokens):
    c, exact, model, src = decoding_case(2, tokens)   # two rows finish early, one falls back to its best alive
    trace = {}
    want = search.beam_search(exact, src, c, Numerics(c.dtype), 4, alpha, MAX_NEW, trace)
    assert trace["margin"] > 1e-4, "the case is too close to a tie to compare decisions"
    assert (want == c.eos_id).any() and not (want == c.eos_id).any(axis=1).all()
    np.testing.assert_array_equal(impl_jax.beam_search(model, src, 4, alpha, MAX_NEW), want)


def test_generation_compiles_once_per_shape_bucket(tokens, compiles):
    """At most one program per search for the shared buckets (none if an earlier test compiled it)."""
    c, _, model, src = decoding_case(2, tokens)
    for seed in range(3):               # other tokens, batches 3..4, lengths 6..8, per-sequence limits, alpha
        other = tokens(c, seed, 3 + seed % 2, 6 + seed)
        other[seed % 2, 2 + seed:] = c.pad_id
        impl_jax.greedy_search(model, other, MAX_NEW - seed)
        impl_jax.beam_search(model, other, 4, 0.3 * seed, MAX_NEW - seed)
    lines = compiles()
    assert len(set(lines)) == len(lines) <= 2, lines
    for line in lines:
        assert line.startswith("impl_jax: compiling ") and "for batch 4, source length 8 (buckets); capacity 8" in line


def test_batch_and_source_padding_change_no_result(tokens):
    """A source padded by hand to another bucket, and each row alone (batch 1, no added rows), search alike."""
    c, _, model, src = decoding_case(3, tokens)
    want = impl_jax.greedy_search(model, src, MAX_NEW)
    np.testing.assert_array_equal(impl_jax.greedy_search(model, np.pad(src, ((0, 0), (0, 9))), MAX_NEW), want)
    for b in range(3):
        alone = impl_jax.greedy_search(model, src[b:b + 1], MAX_NEW)
        np.testing.assert_array_equal(alone[0], want[b, :alone.shape[1]])
        assert (want[b, alone.shape[1]:] == c.pad_id).all()
