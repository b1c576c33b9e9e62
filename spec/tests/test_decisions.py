"""Agreement of decoding judged per decision (spec.decisions)."""

from __future__ import annotations

import numpy as np
import pytest

import spec
from spec import decisions, reference, search, tolerance
from spec.numerics import Numerics

CONFIG = spec.preset("tiny")
SRC = np.array([[5, 9, 17, 33, 2], [7, 8, 2, 0, 0], [40, 41, 42, 43, 2]])   # (B, S)


@pytest.fixture(scope="module")
def decided():
    return decisions.greedy_decisions(spec.init_params(CONFIG, 0), SRC, CONFIG, max_new_tokens=12)


def test_one_decision_per_emitted_token_none_after_the_end(decided):
    d = decided
    assert d.tokens.shape == d.margins.shape == d.tolerances.shape == d.emitted.shape
    for row, n in zip(d.tokens, d.lengths, strict=True):
        eos = np.flatnonzero(row == CONFIG.eos_id)
        assert n == (eos[0] + 1 if eos.size else np.count_nonzero(row != CONFIG.pad_id))
    assert np.all(np.isfinite(d.margins[d.emitted])) and np.all(d.margins[d.emitted] >= 0)
    assert np.all(d.tolerances[d.emitted] > 0)
    assert np.all(np.isinf(d.margins[~d.emitted])) and np.all(d.tolerances[~d.emitted] == 0)
    assert np.array_equal(d.decisive, d.decisive_steps.all(axis=1))


def test_the_tolerance_is_the_policys_at_each_position(decided):
    """One position recomputed by hand: the faithful forward's error there, through logits_tolerance_abs."""
    d, b, t = decided, 0, int(decided.lengths[0]) - 1
    p = reference.as_float64(spec.init_params(CONFIG, 0), CONFIG)
    tgt_in = np.concatenate([[CONFIG.bos_id], d.tokens[b, :t]])[None]                      # (1, t + 1)
    exact = reference.forward(p, SRC[b:b + 1], tgt_in, CONFIG, Numerics("exact"))[0, t]      # (V,)
    faithful = reference.forward(p, SRC[b:b + 1], tgt_in, CONFIG, Numerics(CONFIG.dtype))[0, t]
    want = tolerance.logits_tolerance_abs(tolerance.error_stats(faithful, exact, CONFIG.dtype))
    assert d.tolerances[b, t] == pytest.approx(want, rel=1e-12)


def test_the_faithful_reference_emits_the_exact_tokens_on_every_decisive_row(decided):
    """The faithful reference is conformant: where the contract decides, it decodes as the exact one does."""
    p = reference.as_float64(spec.init_params(CONFIG, 0), CONFIG)
    faithful = search.greedy_search(p, SRC, CONFIG, Numerics(CONFIG.dtype), 12)
    equal = decided.equal(list(faithful))
    assert decided.decisive.any(), "no decisive row: the check would judge nothing"
    assert np.all(equal[decided.decisive])


def test_equal_compares_ids_up_to_the_end_and_nothing_after(decided):
    d = decided
    rows = [np.concatenate([r[:n], np.full(3, CONFIG.pad_id)]) for r, n in zip(d.tokens, d.lengths, strict=True)]
    assert d.equal(rows).all()
    changed = [r.copy() for r in rows]
    changed[1][0] = (changed[1][0] + 1) % CONFIG.vocab_size or 3
    longer = [np.concatenate([r, [7]]) for r in rows]
    assert d.equal(changed).tolist() == [True, False, True]
    assert not d.equal(longer).any()
    with pytest.raises(ValueError, match="rows given"):
        d.equal(rows[:2])


def test_a_margin_within_twice_the_tolerance_is_not_decisive(decided):
    d = decided
    near = decisions.Decisions(d.tokens, np.where(d.emitted, 2 * d.tolerances, np.inf), d.tolerances, d.lengths,
                               d.pad_id)
    far = decisions.Decisions(d.tokens, np.where(d.emitted, 2.01 * d.tolerances, np.inf), d.tolerances, d.lengths,
                              d.pad_id)
    assert not near.decisive.any() and far.decisive.all()
