"""Greedy and beam search over the NumPy reference, with the KV cache (section 6.1).

Both decoders start from ``bos_id``, generate at most ``limit_b`` tokens for
sequence b (default: its non-pad source length + 50; ``validate.generation_limits``)
and stop a sequence at ``eos_id``. Output tokens exclude BOS and include EOS;
rows are right-padded with ``pad_id`` to the longest row. Exact ties break
toward the lower token id (in beam search, the lower ``beam * V + token``).

Each decoder can record ``trace["margin"]``: the smallest gap between two
scores whose order decided the output. A backend whose scores differ from the
reference's by less than half that gap must produce the same tokens.

Beam search is the algorithm of Flax's ``examples/wmt/decode.py`` (after
tensor2tensor) with the paper's settings, written out so that every backend
can follow it step for step. Per sequence, with k = beam_size:

    alive: k hypotheses with log-probabilities [0, -inf, ..., -inf] (fp32)
    finished: k slots with scores -inf
    for t = 1 .. limit:
        cand = alive_logprob[:, None] + log_softmax(logits)     (k, V), fp32
        top 2k of cand.flatten(), ties -> lower flat index
        alive    <- the first k of those whose token is not EOS
        finished <- the first k of (finished, EOS candidates with score
                    cand / lp(t)), old before new on ties
        stop if t == limit or min(finished) >= max(alive) / lp(limit)
    result: best finished, or best alive if none finished

with ``lp(t) = ((5 + t) / 6) ** alpha`` (Wu et al., 2016; paper: alpha = 0.6,
beam size 4) and "first k" a stable descending sort.
"""

from __future__ import annotations

import numpy as np

from spec import reference as ref
from spec import validate
from spec.config import Config
from spec.numerics import Numerics

Trace = dict | None


def length_penalty(length: int, alpha: float) -> float:
    """((5 + |Y|) / 6) ** alpha, |Y| counting EOS (Wu et al., 2016, equation 14)."""
    return ((5.0 + length) / 6.0) ** alpha


def log_softmax(logits: np.ndarray, nx: Numerics) -> np.ndarray:
    """Max-subtracted log-softmax over V of fp32 logits, rounded to fp32."""
    z = logits - logits.max(axis=-1, keepdims=True)
    return nx.acc(z - np.log(np.exp(z).sum(axis=-1, keepdims=True)))


def _descending(x: np.ndarray) -> np.ndarray:
    """Indices sorting ``x`` descending; equal values keep index order."""
    return np.argsort(-x, kind="stable")


def _note_gap(trace: Trace, sorted_scores: np.ndarray, i: int) -> None:
    """Record the gap between sorted scores i and i+1, which decided a cut."""
    if trace is None or i + 1 >= sorted_scores.size:
        return
    a, b = sorted_scores[i], sorted_scores[i + 1]
    if np.isfinite(a) and np.isfinite(b):
        gap = float(a - b)
        trace["margin"] = min(trace.get("margin", np.inf), gap)


def greedy_search(params: ref.Params, src: np.ndarray, c: Config, nx: Numerics, max_new_tokens: int | None = None,
                  trace: Trace = None) -> np.ndarray:
    """Greedy decoding: src (B, S) -> tokens (B, L) int64.

    Raises:
        ValueError: from ``validate.check_source`` and ``validate.generation_limits``.
    """
    validate.check_source(src, c)
    limits = validate.generation_limits(src, c, max_new_tokens)
    B = src.shape[0]
    cache = ref.init_cache(params, ref.encode(params, src, c, nx), src, c, nx)
    out = np.full((B, int(limits.max())), c.pad_id, np.int64)
    done = np.zeros(B, bool)
    tokens = np.full(B, c.bos_id, np.int64)
    for t in range(int(limits.max())):
        logits = ref.decode(params, tokens[:, None], cache, c, nx)[:, 0]    # (B, V)
        for b in np.flatnonzero(~done):
            _note_gap(trace, np.sort(logits[b])[::-1], 0)
        tokens = np.where(done, c.pad_id, np.argmax(logits, axis=-1))     # argmax: first of equal maxima
        out[:, t] = tokens
        done |= (tokens == c.eos_id) | (t + 1 >= limits)
        if done.all():
            return out[:, :t + 1]
    return out


def beam_search(params: ref.Params, src: np.ndarray, c: Config, nx: Numerics, beam_size: int = 4,
                alpha: float = 0.6, max_new_tokens: int | None = None, trace: Trace = None) -> np.ndarray:
    """Beam search (module docstring): src (B, S) -> tokens (B, L) int64.

    Raises:
        ValueError: from ``validate.check_source``, ``validate.check_beam`` and
            ``validate.generation_limits``.
    """
    validate.check_source(src, c)
    validate.check_beam(beam_size, alpha)
    limits = validate.generation_limits(src, c, max_new_tokens)
    rows = [_beam_one(params, src[b:b + 1], int(limits[b]), beam_size, alpha, c, nx, trace)
            for b in range(src.shape[0])]
    out = np.full((len(rows), max(len(r) for r in rows)), c.pad_id, np.int64)
    for b, r in enumerate(rows):
        out[b, :len(r)] = r
    return out


def _beam_one(params: ref.Params, src: np.ndarray, limit: int, k: int, alpha: float, c: Config, nx: Numerics,
              trace: Trace) -> np.ndarray:
    """Beam search for one source (1, S) -> tokens (L,)."""
    memory = np.repeat(ref.encode(params, src, c, nx), k, axis=0)            # (k, S, D)
    cache = ref.init_cache(params, memory, np.repeat(src, k, axis=0), c, nx)
    alive_seq = np.zeros((k, 0), np.int64)
    alive_lp = np.array([0.0] + [-np.inf] * (k - 1))
    fin_seq = np.full((k, limit), c.pad_id, np.int64)
    fin_score = np.full(k, -np.inf)
    tokens = np.full(k, c.bos_id, np.int64)
    max_lp = nx.acc(length_penalty(limit, alpha))
    for t in range(1, limit + 1):
        logits = ref.decode(params, tokens[:, None], cache, c, nx)[:, 0]     # (k, V)
        cand = nx.acc(alive_lp[:, None] + log_softmax(logits, nx)).ravel()   # (k * V,)
        order = _descending(cand)
        top = order[:2 * k]
        beam, tok = np.divmod(top, c.vocab_size)
        seq = np.concatenate([alive_seq[beam], tok[:, None]], axis=1)       # (2k, t)
        is_eos = tok == c.eos_id
        lp_t = nx.acc(length_penalty(t, alpha))
        if trace is not None:
            _trace_beam_step(trace, cand, order, k, c, lp_t, fin_score[k - 1])

        alive_score = np.where(is_eos, -np.inf, cand[top])
        alive = _descending(alive_score)[:k]
        alive_seq, alive_lp, tokens = seq[alive], alive_score[alive], tok[alive]
        cache = cache.select(beam[alive])

        new_score = np.where(is_eos, nx.acc(cand[top] / lp_t), -np.inf)
        merged = np.concatenate([fin_score, new_score])
        keep = _descending(merged)
        _note_gap(trace, merged[keep], k - 1)
        fin_seq = np.concatenate([fin_seq, np.pad(seq, ((0, 0), (0, limit - t)), constant_values=c.pad_id)])[keep[:k]]
        fin_score = merged[keep[:k]]

        bound = nx.acc(alive_lp.max() / max_lp)
        if trace is not None and np.isfinite(fin_score.min()) and np.isfinite(bound):
            trace["margin"] = min(trace.get("margin", np.inf), abs(float(fin_score.min() - bound)))
        if t == limit or fin_score.min() >= bound:
            break
    if np.isfinite(fin_score[0]):
        _note_gap(trace, fin_score, 0)  # the best finished hypothesis is the answer
        return _trim(fin_seq[0], c)
    _note_gap(trace, alive_lp, 0)  # the best alive hypothesis is the answer
    return alive_seq[0]


def _trace_beam_step(trace: dict, cand: np.ndarray, order: np.ndarray, k: int, c: Config, lp_t: float,
                     kth_finished: float) -> None:
    """Record the gaps that decide one beam step (module docstring).

    The top 2k candidates hold at most k EOS candidates (one per beam), so the
    alive set is the top k non-EOS candidates overall: the gap at that cut
    decides it. An EOS candidate matters if its normalised score could enter
    the finished top k; then its distance to the 2k cut decides whether it is
    considered at all.
    """
    eos = order % c.vocab_size == c.eos_id
    _note_gap(trace, cand[order[~eos]], k - 1)
    hi, lo = cand[order[2 * k - 1]], cand[order[2 * k]]
    for rank in np.flatnonzero(eos):
        score = cand[order[rank]]
        if np.isfinite(score) and score / lp_t >= kth_finished:
            gap = score - lo if rank < 2 * k else hi - score
            trace["margin"] = min(trace.get("margin", np.inf), float(gap))


def _trim(seq: np.ndarray, c: Config) -> np.ndarray:
    """A finished hypothesis up to and including its EOS."""
    return seq[:np.flatnonzero(seq == c.eos_id)[0] + 1]
