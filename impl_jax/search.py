"""Greedy and beam search with a preallocated KV cache (paper section 6.1), each one ``lax.while_loop`` over a
decoding step (``impl_jax.stacks.decoder_logits``), in the style of Flax's WMT example.

Both follow ``spec.search`` step for step and return NumPy int64 tokens (``spec.api``: JAX holds int64 only under
the process-wide ``jax_enable_x64`` flag, which a library must not set). There is no dropout: search always
evaluates. Shapes are static and limits are data, and the shapes are bucketed (``spec.shapes``): the batch is
padded to the next power of two with rows of ``pad_id`` (limit 1, dropped from the result), the source to its
length bucket (masked keys), and the cache capacity P is the bucket of the longest limit. So each (batch bucket,
source bucket, P, beam size) compiles once, logging one line on the ``"impl_jax"`` logger.

Ties: ``jnp.argmax`` takes the first of equal maxima; ``lax.top_k`` returns equal values in ascending index order
(XLA's TopK semantics; checked against a stable sort in ``tests/test_search.py``), which is the spec's "lower
token id" and "lower beam * V + token" rule and its stable "old finished before new" merge.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from impl_jax import numerics
from impl_jax.inputs import Ids, device_ids, host_ids
from impl_jax.layers import without_dropout
from impl_jax.model import Transformer, log
from impl_jax.stacks import decoder_logits, encoder_memory, source_cache
from spec import shapes, validate
from spec.search import length_penalty

F32 = jnp.float32


def greedy_search(model: Transformer, src: Ids, max_new_tokens: int | None = None) -> np.ndarray:
    """Greedy decoding (``spec.api``, ``spec.search.greedy_search``): src (B, S) -> tokens (B, L) NumPy int64."""
    c, host = model.config, host_ids(src, model.config)
    validate.check_source(host, c)
    limits = validate.generation_limits(host, c, max_new_tokens)
    src, limits, capacity = _padded(model, host, limits)
    out = jnp.full((src.shape[0], capacity), c.pad_id, jnp.int32)
    out, steps = _greedy(without_dropout(model), src, limits, out)
    return np.asarray(out)[:host.shape[0], :int(steps)].astype(np.int64)


@numerics.jit
def _greedy(model: Transformer, src: jax.Array, limits: jax.Array, out: jax.Array):
    """The loop of ``greedy_search``: src (B, S), limits (B,) on the buckets, out (B, P) ``pad_id``-filled, whose
    P fixes the cache capacity -> (tokens (B, P), steps ())."""
    c, (B, capacity) = model.config, out.shape
    log.info("impl_jax: compiling greedy_search for batch %d, source length %d (buckets); capacity %d",
             *src.shape, capacity)
    model = jax.tree.map(lambda p: p.astype(c.dtype), model)
    special = jnp.asarray([c.pad_id, c.bos_id])                                   # never generated

    def step(state):
        t, tokens, out, done, cache = state
        logits, cache = decoder_logits(model, tokens[:, None], cache)             # (B, 1, V)
        best = jnp.argmax(logits[:, 0].at[..., special].set(-jnp.inf), axis=-1)   # the first of equal maxima
        tokens = jnp.where(done, c.pad_id, best)
        done = done | (tokens == c.eos_id) | (t + 1 >= limits)
        return t + 1, tokens, out.at[:, t].set(tokens), done, cache

    def running(state):
        t, _, _, done, _ = state
        return (t < capacity) & ~done.all()

    state = (jnp.zeros((), jnp.int32), jnp.full((B,), c.bos_id, jnp.int32), out, jnp.zeros((B,), bool),
             source_cache(model, encoder_memory(model, src), src, capacity))
    steps, _, out, _, _ = lax.while_loop(running, step, state)
    return out, steps


class BeamState(NamedTuple):
    """The live state of a beam search over B sources, k beams each, capacity P (the fields named as Flax's
    ``decode.py`` names them)."""
    tokens: jax.Array           # (B, k) int32: each live beam's last token
    live_seqs: jax.Array        # (B, k, P) int32: the live hypotheses, pad-filled past their last token
    live_logprobs: jax.Array    # (B, k) float32: their log-probabilities (-inf: not live)
    finished_seqs: jax.Array    # (B, k, P) int32: the finished hypotheses, EOS included
    finished_scores: jax.Array  # (B, k) float32: their length-penalised scores (-inf: an empty slot)
    steps: jax.Array            # (B,) int32: the steps each source ran


def beam_search(model: Transformer, src: Ids, beam_size: int = 4, alpha: float = 0.6,
                max_new_tokens: int | None = None) -> np.ndarray:
    """Beam search (``spec.api``, ``spec.search.beam_search``): src (B, S) -> tokens (B, L) NumPy int64."""
    c, host = model.config, host_ids(src, model.config)
    validate.check_source(host, c)
    limits = validate.generation_limits(host, c, max_new_tokens)
    validate.check_beam(beam_size, alpha, limits)
    src, limits, capacity = _padded(model, host, limits)
    penalties = np.float32([length_penalty(n, float(alpha)) for n in range(capacity + 1)])  # (P + 1,)
    best, length = _beam(without_dropout(model), src, limits, jnp.asarray(penalties), int(beam_size))
    B = host.shape[0]
    return np.asarray(best)[:B, :int(np.asarray(length)[:B].max())].astype(np.int64)


@functools.partial(numerics.jit, static_argnames=("k",))
def _beam(model: Transformer, src: jax.Array, limits: jax.Array, penalties: jax.Array, k: int):
    """The loop of ``beam_search``: src (B, S), limits (B,) on the buckets, penalties (P + 1,) float32 the length
    penalties of lengths 0..P, whose P fixes the cache capacity -> (the best hypothesis (B, P), its length (B,))."""
    c, B, V, ninf = model.config, src.shape[0], model.config.vocab_size, -jnp.inf
    capacity = penalties.shape[0] - 1
    log.info("impl_jax: compiling beam_search for batch %d, source length %d (buckets); capacity %d, beam %d",
             *src.shape, capacity, k)
    # The tied output projection on the table held in fp32 (the same values): at beam rows (B * k) XLA's CPU backend
    # fused the bf16 product with the norm before it and the softmax after it into one much slower kernel.
    model = jax.tree_util.tree_map_with_path(lambda path, p: numerics.round_to(p, c.dtype) if jax.tree_util.keystr(
        path) == ".embedder.table" else p.astype(c.dtype), model)
    special = jnp.asarray([c.pad_id, c.bos_id])                                   # never generated

    def take(x, idx):  # x (B, N, ...) gathered along axis 1 by idx (B, M) -> (B, M, ...)
        return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1)

    def step(state):
        t, s, done, cache = state
        logits, cache = decoder_logits(model, s.tokens.reshape(B * k, 1), cache)             # (B*k, 1, V)
        logp = jax.nn.log_softmax(logits[:, 0], axis=-1)                                      # fp32, over all of V
        logp = logp.at[..., special].set(-jnp.inf).reshape(B, k, V)
        cand, top = lax.top_k((s.live_logprobs[:, :, None] + logp).reshape(B, k * V), 2 * k)      # (B, 2k)
        beam, tok = top // V, top % V
        seq = take(s.live_seqs, beam).at[:, :, t].set(tok)                                   # (B, 2k, P)
        is_eos = tok == c.eos_id
        alive_score = jnp.where(is_eos, ninf, cand)
        _, alive = lax.top_k(alive_score, k)                                                 # (B, k)
        rows = (jnp.arange(B)[:, None] * k + take(beam, alive)).reshape(B * k)
        cache = cache._replace(self_kv=jax.tree.map(lambda x: x[rows], cache.self_kv), key_mask=cache.key_mask[rows])
        new_scores = jnp.where(is_eos, cand / penalties[t + 1], ninf)                          # (B, 2k)
        finished_scores, keep = lax.top_k(jnp.concatenate([s.finished_scores, new_scores], axis=1), k)  # old first
        finished_seqs = take(jnp.concatenate([s.finished_seqs, seq], axis=1), keep)            # (B, k, P)
        new = BeamState(take(tok, alive), take(seq, alive), take(alive_score, alive), finished_seqs, finished_scores,
                        jnp.full((B,), t + 1))
        best_reachable = new.live_logprobs.max(axis=1) / penalties[limits]                     # (B,)
        stop = (t + 1 == limits) | (new.finished_scores.min(axis=1) >= best_reachable)
        s = jax.tree.map(lambda old, x: jnp.where(done.reshape((B,) + (1,) * (x.ndim - 1)), old, x), s, new)
        return t + 1, s, done | stop, cache

    def running(state):
        t, _, done, _ = state
        return (t < capacity) & ~done.all()

    s = BeamState(jnp.full((B, k), c.bos_id, jnp.int32), jnp.full((B, k, capacity), c.pad_id, jnp.int32),
                  jnp.tile(jnp.asarray([0.0] + [-np.inf] * (k - 1), F32), (B, 1)),
                  jnp.full((B, k, capacity), c.pad_id, jnp.int32), jnp.full((B, k), ninf, F32),
                  jnp.zeros((B,), jnp.int32))
    cache = source_cache(model, encoder_memory(model, src), src, capacity)
    rep = lambda x: jnp.repeat(x, k, axis=0)  # noqa: E731  row b*k + j is beam j of sequence b
    cache = cache._replace(self_kv=jax.tree.map(rep, cache.self_kv), key_mask=rep(cache.key_mask),
                           memory_kv=jax.tree.map(rep, cache.memory_kv), memory_mask=rep(cache.memory_mask))
    _, s, _, _ = lax.while_loop(running, step, (jnp.zeros((), jnp.int32), s, jnp.zeros((B,), bool), cache))
    finished = jnp.isfinite(s.finished_scores[:, 0])                        # else: the best alive hypothesis
    best = jnp.where(finished[:, None], s.finished_seqs[:, 0], s.live_seqs[:, 0])          # (B, P)
    return best, jnp.where(finished, jnp.argmax(best == c.eos_id, axis=1) + 1, s.steps)


def _padded(model: Transformer, src: np.ndarray, limits: np.ndarray) -> tuple[jax.Array, jax.Array, int]:
    """The validated source (B, S) and its limits (B,) on the shape buckets, and the cache capacity: added rows
    get limit 1 (they stop after one step); the capacity, the bucket of the longest limit, holds every sequence."""
    c, (B, S) = model.config, src.shape
    Bb, capacity = shapes.batch_bucket(B), shapes.length_bucket(int(limits.max()), c.max_len)
    return (device_ids(src, Bb, shapes.length_bucket(S, c.max_len), c.pad_id),
            jnp.asarray(np.pad(limits, (0, Bb - B), constant_values=1), jnp.int32), capacity)
