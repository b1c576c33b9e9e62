"""Greedy and beam search (section 6.1), batched, each a compiled ``tf.while_loop`` over the model's decoding step
(``impl_tf.stacks.decoder_logits``) and a preallocated KV cache.

Both follow ``spec.search`` step for step: start from ``bos_id``; at most ``limit_b`` tokens for sequence b
(default its non-pad source length + 50, ``spec.validate.generation_limits``); stop a sequence at ``eos_id``;
exact ties break toward the lower token id (beam search: the lower flat index ``beam * V + token``), which
``tf.math.top_k`` guarantees ("if two elements are equal, the lower-index element appears first"). Pad and BOS are
never generated (``spec.search.forbid_special``). Output tokens exclude BOS, include EOS, and rows are right-padded with
``pad_id`` to the longest row.

As in ``impl_tf.model``, the batch and source length are padded to buckets, and the cache capacity is the bucket of
the longest generation limit, so varying shapes compile a bounded number of loops. Added batch rows are all
``pad_id`` with a limit of one token, and are dropped from the result.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from impl_tf.inputs import device_ids, host_ids
from impl_tf.model import Transformer
from impl_tf.programs import IDS, compiled
from impl_tf.stacks import KVCache, decoder_logits, encoder_memory, source_cache
from spec import shapes, validate
from spec.annotations import Int
from spec.search import forbid_special, length_penalty

NEG_INF = float("-inf")
LIMITS = tf.TensorSpec([None], tf.int32)


def greedy_search(model: Transformer, src, max_new_tokens: int | None = None) -> Int[tf.Tensor, "B L"]:
    """Greedy decoding (section 6.1, ``spec.search``): -> tokens (B, L) int64, in evaluation mode (no dropout)."""
    src, c = host_ids(src), model.config
    validate.check_source(src, c)
    limits = validate.generation_limits(src, c, max_new_tokens)
    args, size = _padded(model, src, limits)
    loop = compiled(model, "greedy_search", functools.partial(_greedy, model), [IDS, LIMITS, IDS], size,
                    dropout=False)
    out, steps = loop(*args)
    return tf.cast(out[:len(src), :int(steps)], tf.int64)


def _greedy(model: Transformer, src: tf.Tensor, limits: tf.Tensor, out: tf.Tensor) -> tuple[tf.Tensor, ...]:
    """src (B, S), limits (B,), out (B, P) pad-filled -> (out, steps taken)."""
    c = model.config
    B, P = tf.shape(out)[0], tf.shape(out)[1]
    special = forbid_special(np.zeros(c.vocab_size), c) == NEG_INF           # (V,) True at pad and BOS
    cache = source_cache(model, encoder_memory(model, src), src, P)

    def step(t, tokens, done, out, cache):
        logits, cache = decoder_logits(model, tokens[:, None], cache)            # (B, 1, V)
        best = tf.math.top_k(tf.where(special, NEG_INF, logits[:, 0]), 1).indices[:, 0]  # lowest id of maxima
        tokens = tf.where(done, c.pad_id, best)
        out = tf.where(tf.range(P)[None, :] == t, tokens[:, None], out)          # out[:, t] = tokens
        done = done | (tokens == c.eos_id) | (t + 1 >= limits)
        return t + 1, tokens, done, out, cache

    state = (tf.constant(0), tf.fill([B], c.bos_id), tf.zeros([B], tf.bool), out, cache)
    t, _, _, out, _ = tf.while_loop(lambda t, _, done, *__: (t < P) & ~tf.reduce_all(done), step, state)
    return out, t


class BeamState(NamedTuple):
    """The beam search's loop state, for B sources of k beams each, capacity P (the fields named as Flax's
    ``decode.py`` names them)."""

    t: tf.Tensor                # () int32: the step about to run, from 1
    tokens: tf.Tensor           # (B k,) int32: each alive beam's last token
    active: tf.Tensor           # (B,) bool: the source is still searching
    steps: tf.Tensor            # (B,) int32: steps each source ran
    live_seqs: tf.Tensor        # (B, k, P) int32, pad-filled past the last token
    live_logprobs: tf.Tensor    # (B, k) float32: log-probabilities
    finished_seqs: tf.Tensor    # (B, k, P) int32: finished hypotheses
    finished_scores: tf.Tensor  # (B, k) float32: their length-penalised scores, -inf where none
    cache: KVCache              # (B k) rows: source b at b*k..b*k+k-1


def beam_search(model: Transformer, src, beam_size: int = 4, alpha: float = 0.6,
                max_new_tokens: int | None = None) -> Int[tf.Tensor, "B L"]:
    """Beam search (``spec.search``; paper: beam 4, alpha 0.6): -> tokens (B, L) int64, in evaluation mode."""
    src, c = host_ids(src), model.config
    validate.check_source(src, c)
    limits = validate.generation_limits(src, c, max_new_tokens)
    validate.check_beam(beam_size, alpha, limits)
    beam_size, alpha = int(beam_size), float(alpha)
    (padded_src, padded_limits, _), size = _padded(model, src, limits)
    penalties = tf.constant([length_penalty(n, alpha) for n in range(size[2] + 1)], tf.float32)  # (P + 1,)
    loop = compiled(model, f"beam_search (beam {beam_size})", functools.partial(_beam, model, k=beam_size),
                    [IDS, LIMITS, tf.TensorSpec([None], tf.float32)], size, dropout=False)
    finished_seqs, finished_scores, live_seqs, steps = (x.numpy() for x in loop(padded_src, padded_limits, penalties))
    rows = []
    for b in range(len(limits)):
        if np.isfinite(finished_scores[b, 0]):
            rows.append(finished_seqs[b, 0, :np.flatnonzero(finished_seqs[b, 0] == c.eos_id)[0] + 1])
        else:
            rows.append(live_seqs[b, :steps[b]])
    out = np.full((len(rows), max(len(r) for r in rows)), c.pad_id, np.int64)
    for b, r in enumerate(rows):
        out[b, :len(r)] = r
    return tf.constant(out)


def _beam(model: Transformer, src: tf.Tensor, limits: tf.Tensor, penalties: tf.Tensor, *, k: int
          ) -> tuple[tf.Tensor, ...]:
    """Beam search of width k for each source row (B, S), limits (B,); penalties (P + 1,) float32 the length
    penalties of lengths 0..P, whose P fixes the cache capacity. Returns finished sequences and scores (B, k, P),
    (B, k), the best alive sequence (B, P) and the steps each row ran (B,)."""
    c, V = model.config, model.config.vocab_size
    B, P = tf.shape(src)[0], tf.shape(penalties)[0] - 1
    seq = tf.fill([B, P], c.pad_id)                                          # (B, P): no token yet
    take = lambda kv, rows: tuple(tuple(tf.gather(x, rows) for x in pair) for pair in kv)  # noqa: E731
    special = forbid_special(np.zeros(V), c) == NEG_INF                     # (V,) True at pad and BOS
    cache = source_cache(model, encoder_memory(model, src), src, P)
    rows = tf.repeat(tf.range(B), k)                                         # (B k): source b at b*k..b*k+k-1
    cache = cache._replace(self_kv=take(cache.self_kv, rows), key_mask=tf.gather(cache.key_mask, rows),
                           memory_kv=take(cache.memory_kv, rows), memory_mask=tf.gather(cache.memory_mask, rows))
    limit_penalty = tf.gather(penalties, limits)                             # (B,) of each source's limit
    state = BeamState(
        t=tf.constant(1), tokens=tf.fill([B * k], c.bos_id), active=tf.ones([B], tf.bool),
        steps=tf.zeros([B], tf.int32),
        live_seqs=tf.tile(seq[:, None], [1, k, 1]), live_logprobs=tf.tile([[0.0] + [NEG_INF] * (k - 1)], [B, 1]),
        finished_seqs=tf.tile(seq[:, None], [1, k, 1]), finished_scores=tf.fill([B, k], NEG_INF), cache=cache)

    def step(s: BeamState) -> BeamState:
        logits, cache = decoder_logits(model, s.tokens[:, None], s.cache)                     # (B k, 1, V)
        z = logits[:, 0] - tf.reduce_max(logits[:, 0], axis=-1, keepdims=True)               # log-softmax over V
        logp = tf.where(special, NEG_INF, z - tf.math.log(tf.reduce_sum(tf.exp(z), axis=-1, keepdims=True)))
        cand = s.live_logprobs[:, :, None] + tf.reshape(logp, [B, k, V])                           # (B, k, V)
        cand, top = tf.math.top_k(tf.reshape(cand, [B, k * V]), 2 * k)                       # (B, 2k) lower index first
        beam, tok = top // V, top % V
        seq = tf.gather(s.live_seqs, beam, batch_dims=1)                                     # (B, 2k, P)
        seq = tf.where(tf.range(P) == s.t - 1, tok[:, :, None], seq)                         # seq[..., t-1] = tok
        is_eos = tok == c.eos_id

        live_logprobs, alive = tf.math.top_k(tf.where(is_eos, NEG_INF, cand), k)                 # (B, k)
        rows = tf.reshape(tf.range(B)[:, None] * k + tf.gather(beam, alive, batch_dims=1), [-1])
        new_score = tf.where(is_eos, cand / penalties[s.t], NEG_INF)                       # (B, 2k)
        finished_scores, keep = tf.math.top_k(tf.concat([s.finished_scores, new_score], 1), k)  # old first on ties
        finished_seqs = tf.gather(tf.concat([s.finished_seqs, seq], 1), keep, batch_dims=1)

        stop = (s.t >= limits) | (tf.reduce_min(finished_scores, 1) >= tf.reduce_max(live_logprobs, 1) / limit_penalty)
        on = s.active
        keep_on = lambda new, old: tf.where(tf.reshape(on, [-1] + [1] * (new.shape.rank - 1)), new, old)  # noqa: E731
        # beams of one source share its memory rows: only the self-attention part of the cache is reordered
        return BeamState(t=s.t + 1, tokens=tf.reshape(tf.gather(tok, alive, batch_dims=1), [-1]), active=on & ~stop,
                         steps=tf.where(on, s.t, s.steps),
                         live_seqs=keep_on(tf.gather(seq, alive, batch_dims=1), s.live_seqs),
                         live_logprobs=keep_on(live_logprobs, s.live_logprobs),
                         finished_seqs=keep_on(finished_seqs, s.finished_seqs),
                         finished_scores=keep_on(finished_scores, s.finished_scores),
                         cache=cache._replace(self_kv=take(cache.self_kv, rows),
                                              key_mask=tf.gather(cache.key_mask, rows)))

    s = tf.while_loop(lambda s: (s.t <= P) & tf.reduce_any(s.active), lambda s: (step(s),), (state,))[0]
    return s.finished_seqs, s.finished_scores, s.live_seqs[:, 0], s.steps


def _padded(model: Transformer, src: np.ndarray, limits: np.ndarray) -> tuple[tuple[tf.Tensor, ...], tuple[int, ...]]:
    """src (B, S) and limits (B,) padded to buckets: (src (B', S') int32, limits (B',) int32 (1 for an added row),
    a (B', P) ``pad_id``-filled output whose P, the bucket of the longest limit, fixes the cache capacity), and the
    bucket sizes (B', S', P)."""
    c = model.config
    size = (shapes.batch_bucket(src.shape[0]), shapes.length_bucket(src.shape[1], c.max_len),
            shapes.length_bucket(int(limits.max()), c.max_len))
    padded_limits = np.ones(size[0], np.int32)  # an added row stops after one token
    padded_limits[:len(limits)] = limits
    return (device_ids(src, *size[:2], c.pad_id), tf.constant(padded_limits),
            tf.fill([size[0], size[2]], c.pad_id)), size

