"""The training demo's task and scoring (spec.demo): batches, the held-out set, exact match."""

from __future__ import annotations

import numpy as np
import pytest

from spec import demo

C = demo.DEMO_CONFIG


def test_reverse_batch_layout():
    src, tgt_in, tgt_out = demo.reverse_batch(np.random.default_rng(1), C, 32)
    assert src.shape == tgt_in.shape == tgt_out.shape and src.dtype == np.int64
    for s, ti, to in zip(src, tgt_in, tgt_out, strict=True):
        n = int(np.flatnonzero(s == C.eos_id)[0])                    # the sequence's length
        seq = s[:n]
        assert demo.MIN_LEN <= n <= demo.MAX_LEN
        assert np.isin(seq, demo.ordinary_tokens(C)).all()           # never pad, BOS or EOS inside
        assert (to[:n] == seq[::-1]).all() and to[n] == C.eos_id
        assert ti[0] == C.bos_id and (ti[1:n + 1] == seq[::-1]).all()
        assert (s[n + 1:] == C.pad_id).all() and (to[n + 1:] == C.pad_id).all() and (ti[n + 1:] == C.pad_id).all()
    assert src.shape[1] == max(int(np.flatnonzero(s == C.eos_id)[0]) for s in src) + 1   # padded to the longest


def test_reverse_batch_is_seeded_and_checks_lengths():
    a, b = (demo.reverse_batch(np.random.default_rng(7), C, 4) for _ in range(2))
    assert all((x == y).all() for x, y in zip(a, b, strict=True))
    with pytest.raises(ValueError, match="min_len"):
        demo.reverse_batch(np.random.default_rng(0), C, 4, min_len=9, max_len=8)


def test_heldout_is_fixed():
    (s1, e1), (s2, e2) = demo.heldout(C, 16), demo.heldout(C, 16)
    assert (s1 == s2).all() and (e1 == e2).all() and len(s1) == 16


def test_exact_match_whole_rows():
    expected = np.array([[5, 6, 2, 0], [7, 2, 0, 0]])
    assert demo.exact_match(np.array([[5, 6, 2], [7, 2, 0]]), expected) == 1.0         # padding widths differ
    assert demo.exact_match(np.array([[5, 6, 2], [7, 3, 2]]), expected) == 0.5         # no EOS where expected
    assert demo.exact_match(np.array([[5, 6], [7, 2]]), expected) == 0.5                # cut before EOS
    with pytest.raises(ValueError, match="rows"):
        demo.exact_match(expected[:1], expected)
