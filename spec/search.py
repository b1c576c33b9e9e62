"""Greedy and beam search over the NumPy reference, with the KV cache (section 6.1).

Both decoders start from ``bos_id``, generate at most ``limit_b`` tokens for
sequence b (default: its non-pad source length + 50; ``validate.generation_limits``)
and stop a sequence at ``eos_id``. Output tokens exclude BOS and include EOS;
rows are right-padded with ``pad_id`` to the longest row. Exact ties break
toward the lower token id (in beam search, the lower ``beam * V + token``).

``pad_id`` and ``bos_id`` are never generated (``forbid_special``): a generated
pad would be an invisible key in later steps and could not be told from the
right-padding of the output. Their scores become -inf before every choice,
after the log-softmax over the whole vocabulary (as fairseq does for pad), so
the other tokens' log-probabilities are those of the full distribution.

Each decoder can record a trace: ``trace["margin"]`` is the smallest gap
between two scores whose order decided the output (a backend whose scores
differ from the reference's by less than half that gap must produce the same
tokens), and ``trace["rows"]`` the same per sequence, with what happened in it.
A row also lists its ``decisions`` as (gap, reach): ``reach`` is the best
score, as a finished hypothesis, that a hypothesis on either side of the
decision can still reach. In beam search most cuts fall among hypotheses far
below the answer's ``score``; log-probabilities only fall as tokens are added,
so such a hypothesis ranks below every ancestor of the answer at every step and
can neither become the answer nor displace one, nor end the search early
(the bound it would stop on is below the answer). ``decisive_margin`` is the
smallest gap among the decisions that reach the answer's score.

Beam search is the algorithm of Flax's ``examples/wmt/decode.py`` (after
tensor2tensor) with the paper's settings, written out so that every backend
can follow it step for step. Per sequence, with k = beam_size:

    alive: k hypotheses with log-probabilities [0, -inf, ..., -inf] (fp32)
    finished: k slots with scores -inf
    for t = 1 .. limit:
        cand = alive_logprob[:, None] + log_softmax(logits)     (k, V), fp32
        cand[:, pad_id] = cand[:, bos_id] = -inf
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
from spec.search_trace import Trace, note_gap, note_margin, overall_margin, row_traces, trace_beam_step


def length_penalty(length: int, alpha: float) -> float:
    """((5 + |Y|) / 6) ** alpha, |Y| counting EOS (Wu et al., 2016, equation 14).

    ``alpha`` is one that ``validate.check_beam`` accepted, so the result is finite.
    """
    return ((5.0 + length) / 6.0) ** alpha


def log_softmax(logits: np.ndarray, nx: Numerics) -> np.ndarray:
    """Max-subtracted log-softmax over V of fp32 logits, rounded to fp32."""
    z = logits - logits.max(axis=-1, keepdims=True)
    return nx.acc(z - np.log(np.exp(z).sum(axis=-1, keepdims=True)))


def forbid_special(scores: np.ndarray, c: Config) -> np.ndarray:
    """``scores`` (..., V) with ``pad_id`` and ``bos_id`` set to -inf: never generated (module docstring)."""
    scores = scores.copy()
    scores[..., [c.pad_id, c.bos_id]] = -np.inf
    return scores


def candidate_count(beam_size: int) -> int:
    """Candidates kept per step: 2k, so that k of them are not EOS even if k end."""
    return 2 * beam_size


def _descending(x: np.ndarray) -> np.ndarray:
    """Indices sorting ``x`` descending; equal values keep index order."""
    return np.argsort(-x, kind="stable")


def decisive_margin(row: dict, slack: float) -> float:
    """The smallest gap of a row's decisions whose reach is within ``slack`` of the answer's score (all of them
    where the row has no ``score``: greedy search, or a beam that finished nothing)."""
    floor = row.get("score", -np.inf) - slack
    return min((gap for gap, reach in row.get("decisions", []) if reach >= floor), default=np.inf)


def greedy_search(params: ref.Params, src: np.ndarray, c: Config, nx: Numerics, max_new_tokens: int | None = None,
                  trace: Trace = None) -> np.ndarray:
    """Greedy decoding: src (B, S) -> tokens (B, L) int64.

    Raises:
        ValueError: from ``validate.check_source`` and ``validate.generation_limits``.
    """
    validate.check_source(src, c)
    limits = validate.generation_limits(src, c, max_new_tokens)
    B = src.shape[0]
    rows = row_traces(trace, B)
    model = ref.Transformer(params, c, nx)
    cache = model.init_cache(model.encode(src), src, int(limits.max()))
    out = np.full((B, int(limits.max())), c.pad_id, np.int64)
    done = np.zeros(B, bool)
    tokens = np.full(B, c.bos_id, np.int64)
    for t in range(int(limits.max())):
        logits, cache = model.decode(tokens[:, None], cache)
        logits = forbid_special(logits[:, 0], c)                           # (B, V)
        for b in np.flatnonzero(~done):
            note_gap(rows[b], np.sort(logits[b])[::-1], 0)
        tokens = np.where(done, c.pad_id, np.argmax(logits, axis=-1))     # argmax: first of equal maxima
        out[:, t] = tokens
        done |= (tokens == c.eos_id) | (t + 1 >= limits)
        if done.all():
            out = out[:, :t + 1]
            break
    overall_margin(trace)
    return out


def beam_search(params: ref.Params, src: np.ndarray, c: Config, nx: Numerics, beam_size: int = 4,
                alpha: float = 0.6, max_new_tokens: int | None = None, trace: Trace = None) -> np.ndarray:
    """Beam search (module docstring): src (B, S) -> tokens (B, L) int64.

    A row's trace records, besides its margin: ``steps`` run, ``early_stop``
    (the bound ended the search before the limit) and ``overtaken`` (the answer
    finished later than the first hypothesis that finished, which it beat).

    Raises:
        ValueError: from ``validate.check_source``, ``validate.generation_limits``
            and ``validate.check_beam``.
    """
    validate.check_source(src, c)
    limits = validate.generation_limits(src, c, max_new_tokens)
    validate.check_beam(beam_size, alpha, limits)
    traces = row_traces(trace, src.shape[0])
    rows = [_beam_one(params, src[b:b + 1], int(limits[b]), int(beam_size), float(alpha), c, nx, traces[b])
            for b in range(src.shape[0])]
    overall_margin(trace)
    out = np.full((len(rows), max(len(r) for r in rows)), c.pad_id, np.int64)
    for b, r in enumerate(rows):
        out[b, :len(r)] = r
    return out


def _beam_one(params: ref.Params, src: np.ndarray, limit: int, k: int, alpha: float, c: Config, nx: Numerics,
              trace: Trace) -> np.ndarray:
    """Beam search for one source (1, S) -> tokens (L,)."""
    model = ref.Transformer(params, c, nx)
    memory = np.repeat(model.encode(src), k, axis=0)                         # (k, S, D)
    cache = model.init_cache(memory, np.repeat(src, k, axis=0), limit)
    alive_seq = np.zeros((k, 0), np.int64)
    alive_lp = np.array([0.0] + [-np.inf] * (k - 1))
    fin_seq = np.full((k, limit), c.pad_id, np.int64)
    fin_score = np.full(k, -np.inf)
    tokens = np.full(k, c.bos_id, np.int64)
    max_lp = nx.acc(length_penalty(limit, alpha))
    first_finished = None
    n = candidate_count(k)
    for t in range(1, limit + 1):
        logits, cache = model.decode(tokens[:, None], cache)                 # (k, 1, V)
        logp = forbid_special(log_softmax(logits[:, 0], nx), c)
        cand = nx.acc(alive_lp[:, None] + logp).ravel()                       # (k * V,)
        order = _descending(cand)
        top = order[:n]
        beam, tok = np.divmod(top, c.vocab_size)
        seq = np.concatenate([alive_seq[beam], tok[:, None]], axis=1)       # (2k, t)
        is_eos = tok == c.eos_id
        lp_t = nx.acc(length_penalty(t, alpha))
        if trace is not None:
            trace_beam_step(trace, cand, order, k, n, c, lp_t, fin_score[k - 1], max_lp)

        alive_score = np.where(is_eos, -np.inf, cand[top])
        alive = _descending(alive_score)[:k]
        alive_seq, alive_lp, tokens = seq[alive], alive_score[alive], tok[alive]
        cache = _select(cache, beam[alive])

        new_score = np.where(is_eos, nx.acc(cand[top] / lp_t), -np.inf)
        merged = np.concatenate([fin_score, new_score])
        keep = _descending(merged)
        ranked = merged[keep]
        note_gap(trace, ranked, k - 1, ranked[k - 1])
        fin_seq = np.concatenate([fin_seq, np.pad(seq, ((0, 0), (0, limit - t)), constant_values=c.pad_id)])[keep[:k]]
        fin_score = merged[keep[:k]]
        if first_finished is None and np.isfinite(fin_score[0]):
            first_finished = t

        bound = nx.acc(alive_lp.max() / max_lp)
        if np.isfinite(fin_score.min()) and np.isfinite(bound):
            note_margin(trace, abs(float(fin_score.min() - bound)), max(bound, fin_score.min()))
        if t == limit or fin_score.min() >= bound:
            break
    if trace is not None:
        trace.update(steps=t, early_stop=bool(t < limit), overtaken=False)
    if np.isfinite(fin_score[0]):
        note_gap(trace, fin_score, 0)  # the best finished hypothesis is the answer
        answer = _trim(fin_seq[0], c)
        if trace is not None:
            trace.update(overtaken=bool(len(answer) > first_finished), score=float(fin_score[0]))
        return answer
    note_gap(trace, alive_lp, 0)  # the best alive hypothesis is the answer
    return alive_seq[0]


def _select(cache: ref.KVCache, rows: np.ndarray) -> ref.KVCache:
    """The cache of batch rows ``rows`` (beam reordering)."""
    take = lambda kv: (kv[0][rows], kv[1][rows])  # noqa: E731
    return ref.KVCache([take(kv) for kv in cache.self_kv], cache.key_mask[rows],
                       [take(kv) for kv in cache.memory_kv], cache.memory_mask[rows], cache.length)


def _trim(seq: np.ndarray, c: Config) -> np.ndarray:
    """A finished hypothesis up to and including its EOS."""
    return seq[:np.flatnonzero(seq == c.eos_id)[0] + 1]
