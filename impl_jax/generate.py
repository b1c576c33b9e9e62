"""Greedy and beam search with a preallocated KV cache, each one ``lax.while_loop`` (paper section 6.1).

Both follow ``spec.search`` step for step: start from BOS, stop each sequence
at EOS or at its own limit (non-pad source length + 50 by default,
``spec.validate.generation_limits``), return tokens (B, L) that exclude BOS,
include EOS and are right-padded with ``pad_id`` to the longest row, as a NumPy
int64 array (JAX holds int64 only under the process-wide ``jax_enable_x64``
flag, which a library must not set). Pad and BOS are never generated
(``forbid_special``). JAX here has no dropout: search is always in evaluation mode.

Shapes are static and limits are data, and the shapes are bucketed
(``spec.shapes.batch_bucket``, ``length_bucket``): the batch is padded to the
next power of two with rows of ``pad_id`` (limit 1, dropped from the result),
the source to its length bucket with ``pad_id`` (masked keys), and the cache
capacity P is the bucket of the longest limit. So each (batch bucket, source
bucket, P, beam size) compiles once, and logs one line on the ``"impl_jax"``
logger. A step runs one token through the decoder against the cache
(attention reads the P cache slots; everything else is one token's work);
cross-attention K/V are computed once per source.

Ties: ``jnp.argmax`` takes the first of equal maxima; ``lax.top_k`` returns
equal values in ascending index order (XLA's TopK semantics; checked against a
stable sort in ``tests/test_generate.py``), which is the spec's "lower token id"
and "lower beam * V + token" rule and its stable "old finished before new" merge.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from impl_jax import layers
from impl_jax.model import (
    Ids,
    KVCache,
    Transformer,
    cast_params,
    decoder_stack,
    empty_cache,
    encoder_stack,
    log,
    padded_ids,
)
from spec import shapes, validate
from spec.config import Config

if TYPE_CHECKING:  # shape hints (jaxtyping), for readers and type checkers only
    from jaxtyping import Int

Params = dict
F32 = jnp.float32


def _bucketed(model: Transformer, src: np.ndarray, limits: np.ndarray) -> tuple[jax.Array, jax.Array, int]:
    """The validated source (B, S) and its limits (B,) on the shape buckets, and the cache capacity.

    Added rows get limit 1: they stop after one step and never hold the loop. The
    capacity, the bucket of the longest limit, holds every sequence's tokens
    (``validate.generation_limits`` checked the limits against max_len).
    """
    c, (B, S) = model.config, src.shape
    Bb, capacity = shapes.batch_bucket(B), shapes.length_bucket(int(limits.max()), c.max_len)
    return (padded_ids(src, src, Bb, shapes.length_bucket(S, c.max_len), c.pad_id),
            jnp.asarray(np.pad(limits, (0, Bb - B), constant_values=1), jnp.int32), capacity)


def _prefill(params: Params, src: jax.Array, config: Config, capacity: int, repeat: int = 1) -> KVCache:
    """Encode ``src`` (B, S) and build an empty cache; with ``repeat`` = k, each row repeated k times (beams)."""
    cache = empty_cache(params, encoder_stack(params, src, config), src, capacity, config)
    rep = lambda x: jnp.repeat(x, repeat, axis=0)  # noqa: E731  row b*k + j is beam j of sequence b
    return cache._replace(self_kv=jax.tree.map(rep, cache.self_kv), key_mask=rep(cache.key_mask),
                          memory_kv=jax.tree.map(rep, cache.memory_kv), memory_mask=rep(cache.memory_mask))


def forbid_special(scores: jax.Array, pad_id: int, bos_id: int) -> jax.Array:
    """scores (..., V) with ``pad_id`` and ``bos_id`` at -inf: never generated (``spec.search.forbid_special``)."""
    return scores.at[..., jnp.asarray([pad_id, bos_id])].set(-jnp.inf)


# ----------------------------------------------------------------- greedy

@functools.partial(layers.jit, static_argnames=("config", "capacity"))
def _greedy(params: Params, src: jax.Array, limits: jax.Array, config: Config, capacity: int):
    log.info("impl_jax: compiling greedy_search for batch %d, source length %d (buckets); capacity %d",
             *src.shape, capacity)
    params = cast_params(params, config)
    B = src.shape[0]

    def step(state):
        t, tokens, out, done, cache = state
        logits, cache = decoder_stack(params, tokens[:, None], cache, config)           # (B, 1, V)
        best = jnp.argmax(forbid_special(logits[:, 0], config.pad_id, config.bos_id), axis=-1)  # first of maxima
        tokens = jnp.where(done, config.pad_id, best)
        done = done | (tokens == config.eos_id) | (t + 1 >= limits)
        return t + 1, tokens, out.at[:, t].set(tokens), done, cache

    def running(state):
        t, _, _, done, _ = state
        return (t < capacity) & ~done.all()

    state = (jnp.zeros((), jnp.int32), jnp.full((B,), config.bos_id, jnp.int32),
             jnp.full((B, capacity), config.pad_id, jnp.int32), jnp.zeros((B,), bool),
             _prefill(params, src, config, capacity))
    steps, _, out, _, _ = lax.while_loop(running, step, state)
    return out, steps


def greedy_search(model: Transformer, src: Ids, max_new_tokens: int | None = None) -> Int[np.ndarray, "B L"]:
    """Greedy decoding (``spec.search.greedy_search``, section 6.1): src (B, S) int -> tokens (B, L) NumPy int64.

    Each step takes the most probable token (the lower id on ties; never pad or
    BOS); a sequence stops at EOS (included) or at its limit, ``max_new_tokens``
    if given, else its non-pad source length + 50.

    Raises:
        ValueError: from ``spec.validate.check_source`` and ``generation_limits``.
    """
    c, host = model.config, np.asarray(src)
    validate.check_source(host, c)
    limits = validate.generation_limits(host, c, max_new_tokens)
    src, limits, capacity = _bucketed(model, host, limits)
    out, steps = _greedy(model.params, src, limits, c, capacity)
    return np.asarray(out)[:host.shape[0], :int(steps)].astype(np.int64)


# ----------------------------------------------------------------- beam

def _top(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """The k largest of x (..., N) in descending order, equal values in ascending index order."""
    return lax.top_k(x, k)


def _take(x: jax.Array, idx: jax.Array) -> jax.Array:
    """x (B, N, ...) gathered along axis 1 by idx (B, M) -> (B, M, ...)."""
    return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1)


@functools.partial(layers.jit, static_argnames=("config", "capacity", "k"))
def _beam(params: Params, src: jax.Array, limits: jax.Array, lp: jax.Array, config: Config, capacity: int, k: int):
    log.info("impl_jax: compiling beam_search for batch %d, source length %d (buckets); capacity %d, beam %d",
             *src.shape, capacity, k)
    params = cast_params(params, config)
    # The tied output projection in fp32 (the same values, exact): at beam rows (B * k) XLA's CPU backend fused the
    # bf16 product with the norm before it and the softmax after it into one kernel 3.4x slower than the fp32 one
    # (profiled at base, B * k = 32: 638 against 187 ms of a 32-token search).
    params = {**params, "embedding": params["embedding"].astype(F32)}
    B, V, ninf = src.shape[0], config.vocab_size, -jnp.inf

    def step(state):  # s: per-sequence beam state, arrays with leading axes (B, k)
        t, s, done, cache = state
        logits, cache = decoder_stack(params, s["tokens"].reshape(B * k, 1), cache, config)   # (B*k, 1, V)
        logp = jax.nn.log_softmax(logits[:, 0], axis=-1)                                      # fp32, over all of V
        logp = forbid_special(logp, config.pad_id, config.bos_id).reshape(B, k, V)
        cand, top = _top((s["alive_lp"][:, :, None] + logp).reshape(B, k * V), 2 * k)        # (B, 2k)
        beam, tok = top // V, top % V
        seq = _take(s["alive_seq"], beam).at[:, :, t].set(tok)                                # (B, 2k, P)
        is_eos = tok == config.eos_id

        alive_score = jnp.where(is_eos, ninf, cand)
        _, alive = _top(alive_score, k)                                                       # (B, k)
        new = {"alive_seq": _take(seq, alive), "alive_lp": _take(alive_score, alive), "tokens": _take(tok, alive)}
        rows = (jnp.arange(B)[:, None] * k + _take(beam, alive)).reshape(B * k)
        cache = cache._replace(self_kv=jax.tree.map(lambda x: x[rows], cache.self_kv), key_mask=cache.key_mask[rows])

        merged = jnp.concatenate([s["fin_score"], jnp.where(is_eos, cand / lp[t + 1], ninf)], axis=1)  # (B, 3k)
        new["fin_score"], keep = _top(merged, k)                                             # old before new on ties
        new["fin_seq"] = _take(jnp.concatenate([s["fin_seq"], seq], axis=1), keep)
        new["steps"] = jnp.full((B,), t + 1)

        bound = new["alive_lp"].max(axis=1) / lp[limits]
        stop = (t + 1 == limits) | (new["fin_score"].min(axis=1) >= bound)
        s = jax.tree.map(lambda old, x: jnp.where(done.reshape((B,) + (1,) * (x.ndim - 1)), old, x), s, new)
        return t + 1, s, done | stop, cache

    def running(state):
        t, _, done, _ = state
        return (t < capacity) & ~done.all()

    s = {"tokens": jnp.full((B, k), config.bos_id, jnp.int32),
         "alive_seq": jnp.full((B, k, capacity), config.pad_id, jnp.int32),
         "alive_lp": jnp.tile(jnp.asarray([0.0] + [-np.inf] * (k - 1), F32), (B, 1)),
         "fin_seq": jnp.full((B, k, capacity), config.pad_id, jnp.int32),
         "fin_score": jnp.full((B, k), ninf, F32),
         "steps": jnp.zeros((B,), jnp.int32)}
    state = (jnp.zeros((), jnp.int32), s, jnp.zeros((B,), bool), _prefill(params, src, config, capacity, k))
    _, s, _, _ = lax.while_loop(running, step, state)

    finished = jnp.isfinite(s["fin_score"][:, 0])                     # else: the best alive hypothesis
    best = jnp.where(finished[:, None], s["fin_seq"][:, 0], s["alive_seq"][:, 0])      # (B, P)
    length = jnp.where(finished, jnp.argmax(best == config.eos_id, axis=1) + 1, s["steps"])
    return best, length


def length_penalty_table(capacity: int, alpha: float) -> np.ndarray:
    """lp(t) = ((5 + t) / 6) ** alpha for t = 0..capacity (Wu et al., 2016), in float64 rounded to fp32."""
    return (((5.0 + np.arange(capacity + 1)) / 6.0) ** alpha).astype(np.float32)


def beam_search(model: Transformer, src: Ids, beam_size: int = 4, alpha: float = 0.6,
                max_new_tokens: int | None = None) -> Int[np.ndarray, "B L"]:
    """Beam search (``spec.search.beam_search``; section 6.1: beam 4, alpha 0.6): src (B, S) int -> tokens (B, L)
    NumPy int64.

    Scores are log-probabilities normalised by the length penalty
    ``((5 + L) / 6) ** alpha`` (Wu et al., 2016). The batch is searched together;
    each sequence stops on its own (the spec's early-stop rule or its limit) and
    then keeps its state. Its best finished hypothesis is returned, else its best
    alive one.

    Raises:
        ValueError: from ``spec.validate.check_source``, ``generation_limits`` and ``check_beam``.
    """
    c, host = model.config, np.asarray(src)
    validate.check_source(host, c)
    limits = validate.generation_limits(host, c, max_new_tokens)
    validate.check_beam(beam_size, alpha, limits)
    src, limits, capacity = _bucketed(model, host, limits)
    best, length = _beam(model.params, src, limits, jnp.asarray(length_penalty_table(capacity, float(alpha))), c,
                         capacity, int(beam_size))
    B = host.shape[0]
    return np.asarray(best)[:B, :int(np.asarray(length)[:B].max())].astype(np.int64)
