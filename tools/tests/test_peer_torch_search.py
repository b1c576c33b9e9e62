"""The stock peer's searches: a copy task it must learn, greedy and beam search against ``spec.search``'s own
algorithms driven by its logits, padding, ties."""

from __future__ import annotations

import collections
import types

import numpy as np
import pytest
import torch

from spec import api
from spec import search as spec_search
from spec.numerics import Numerics
from tools import peer_torch as P
from tools.peer_torch.search import next_logits, stable_top
from tools.tests.peer_torch_cases import COPY, copy_batch, train_copy


@pytest.fixture(scope="module")
def copier():
    """The peer with the tutorial's Xavier embedding (``init="xavier"``) trained 300 steps on the copy task ->
    (model, losses, held-out src). (With the default N(0, 1) embedding, whose sqrt(D) scale drowns the positional
    encoding, it reproduces half the rows after 1,000 steps: ``test_the_default_init_learns_too``.)"""
    model, losses = train_copy("xavier", 300)
    return model, losses, copy_batch(np.random.default_rng(99), 32)[0]


def _reproduced(tokens, src):
    return np.mean([np.array_equal(t[:np.flatnonzero(s)[-1] + 1], s[:np.flatnonzero(s)[-1] + 1])
                    and (len(t) == np.flatnonzero(s)[-1] + 1 or t[np.flatnonzero(s)[-1] + 1] == 0)
                    for t, s in zip(tokens, src, strict=True)])


def test_the_copy_task_is_learned(copier):
    model, losses, src = copier
    assert np.mean(losses[-20:]) < 0.2 * np.mean(losses[:5])
    assert model.training                              # train_step left the new model's mode as it was
    greedy = P.greedy_search(model, src)
    beam = P.beam_search(model, src)
    assert model.training                              # searches too
    assert greedy.dtype == beam.dtype == np.int64
    assert _reproduced(greedy, src) >= 0.8
    assert _reproduced(beam, src) >= 0.8


def _spec_driven_by(model):
    """A stand-in for ``spec.reference``'s ``Transformer`` and ``KVCache`` that computes with the peer:
    ``spec.search``'s own greedy and beam search then run on the peer's fp32 logits. The cache's fields carry the
    peer's state, so that the search's beam reordering selects its rows: the target prefix (``self_kv``), the
    encoder output (``memory_kv``) and the source ids (``memory_mask``)."""
    KVCache = collections.namedtuple("KVCache", api.KV_CACHE_FIELDS)

    class Transformer:
        def __init__(self, params, c, nx):
            self.pad_id = c.pad_id

        def encode(self, src):
            with torch.inference_mode():
                return model._encode(torch.as_tensor(src)).numpy()                # (B, S, D) float32

        def init_cache(self, memory, src, capacity):
            prefix = np.zeros((len(src), 0), np.int64)
            return KVCache([(prefix, prefix)], prefix, [(memory, memory)], src, 0)

        def decode(self, tokens, cache):
            prefix = np.concatenate([cache.self_kv[0][0], tokens], axis=1)
            memory, src = cache.memory_kv[0][0], cache.memory_mask
            with torch.inference_mode():
                logits = next_logits(model, torch.as_tensor(prefix), torch.as_tensor(memory),
                                        torch.as_tensor(src == self.pad_id))
            after = KVCache([(prefix, prefix)], prefix, cache.memory_kv, src, cache.length + tokens.shape[1])
            return logits.double().numpy()[:, None], after                         # (B, 1, V)

    return types.SimpleNamespace(Transformer=Transformer, KVCache=KVCache)


def test_searches_follow_spec_search(copier, monkeypatch):
    model, _, src = copier
    random_model = P.Transformer(COPY, seed=1)
    model.eval(), random_model.eval()
    try:
        for m, limit in ((model, None), (random_model, 6)):
            monkeypatch.setattr(spec_search, "ref", _spec_driven_by(m))
            nx = Numerics("float32")
            np.testing.assert_array_equal(P.greedy_search(m, src, limit),
                                          spec_search.greedy_search(None, src, COPY, nx, limit))
            for k, alpha in ((4, 0.6), (3, 1.0), (1, 0.6)):
                np.testing.assert_array_equal(P.beam_search(m, src, k, alpha, limit),
                                              spec_search.beam_search(None, src, COPY, nx, k, alpha, limit))
    finally:
        model.train()


def test_beam_one_is_greedy_and_padding_changes_nothing(copier):
    """Beam 1 is greedy on the trained model. Not always on an untrained one, by spec.search's algorithm: an EOS
    second at some step finishes greedy's prefix + EOS, which wins once the greedy continuation's log-probability
    falls below its score (the early-stop bound); such a row must be exactly that."""
    model, _, src = copier
    np.testing.assert_array_equal(P.beam_search(model, src, beam_size=1), P.greedy_search(model, src))
    untrained = P.Transformer(COPY, seed=2)
    beam, greedy = P.beam_search(untrained, src, beam_size=1), P.greedy_search(untrained, src)
    assert sum(np.array_equal(b, g) for b, g in zip(beam, greedy, strict=True)) >= len(src) // 2
    for b, g in zip(beam, greedy, strict=True):
        n = np.flatnonzero(b == COPY.eos_id)[0] + 1 if (b == COPY.eos_id).any() else len(b)
        assert np.array_equal(b, g) or (b[n - 1] == COPY.eos_id and np.array_equal(b[:n - 1], g[:n - 1])
                                        and not b[n:].any())
    for m in (model, untrained):
        padded = np.pad(src, ((0, 0), (0, 5)))
        np.testing.assert_array_equal(P.greedy_search(m, padded), P.greedy_search(m, src))
        np.testing.assert_array_equal(P.beam_search(m, padded), P.beam_search(m, src))
    # the default limit: non-pad source length + 50; pad and BOS never generated
    untrained = P.Transformer(COPY, seed=4)
    out = P.greedy_search(untrained, src[:4])
    assert out.shape[1] <= (src[:4] != 0).sum(1).max() + 50
    assert not np.isin(out[out != 0], [COPY.pad_id, COPY.bos_id]).any()


def test_the_top_candidates_break_ties_toward_the_lower_index():
    """Beam search's top 2k (``spec.search``: ties -> the lower flat index), by ``topk`` with a fallback."""
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        x = torch.randint(0, 5, (4, 40), generator=g).float()                  # many ties
        x[torch.rand(4, 40, generator=g) < 0.6] = -torch.inf                    # rows with fewer than 8 finite
        if trial % 2:
            x = torch.randn(4, 40, generator=g)
        np.testing.assert_array_equal(stable_top(x, 8), np.argsort(-x.numpy(), axis=1, kind="stable")[:, :8])
