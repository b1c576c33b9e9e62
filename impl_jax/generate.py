"""Greedy and beam search with a preallocated KV cache, each one ``lax.while_loop`` (paper section 6.1).

Both follow ``spec.search`` step for step: start from BOS, stop each sequence
at EOS or at its own limit (non-pad source length + 50 by default,
``spec.validate.generation_limits``), return tokens (B, L) int32 that exclude
BOS, include EOS and are right-padded with ``pad_id`` to the longest row.
Pad and BOS are never generated (``forbid_special``).

Shapes are static and limits are data: the cache capacity P is
``max_new_tokens`` if given, else ``min(max_len, S + 50)`` (every default
limit fits), so each (batch, source length, P, beam size) compiles once. A
step runs one token through the decoder against the cache (attention reads
the P cache slots; everything else is one token's work); cross-attention K/V
are computed once per source.

Ties: ``jnp.argmax`` takes the first of equal maxima; ``lax.top_k`` returns
equal values in ascending index order (XLA's TopK semantics; checked against a
stable sort in ``tests/test_generate.py``), which is the spec's "lower token id"
and "lower beam * V + token" rule and its stable "old finished before new" merge.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from impl_jax import model
from spec import validate
from spec.config import Config

Params = dict
F32 = jnp.float32
EXTRA = 50  # default limit: source length + 50 (section 6.1)


def _capacity(src: np.ndarray, config: Config, max_new_tokens: int | None) -> int:
    """Static cache capacity: every sequence's limit fits (``validate.generation_limits`` checked max_len)."""
    return int(max_new_tokens) if max_new_tokens is not None else min(config.max_len, src.shape[1] + EXTRA)


def _prefill(params: Params, src: jax.Array, config: Config, capacity: int, repeat: int = 1) -> model.KVCache:
    """Encode ``src`` (B, S) and build an empty cache; with ``repeat`` = k, each row repeated k times (beams)."""
    cache = model.empty_cache(params, model.encoder_stack(params, src, config), src, capacity, config)
    rep = lambda x: jnp.repeat(x, repeat, axis=0)  # noqa: E731  row b*k + j is beam j of sequence b
    return cache._replace(self_kv=jax.tree.map(rep, cache.self_kv), key_mask=rep(cache.key_mask),
                          memory_kv=jax.tree.map(rep, cache.memory_kv), memory_mask=rep(cache.memory_mask))


def forbid_special(scores: jax.Array, pad_id: int, bos_id: int) -> jax.Array:
    """scores (..., V) with ``pad_id`` and ``bos_id`` at -inf: never generated (``spec.search.forbid_special``)."""
    return scores.at[..., jnp.asarray([pad_id, bos_id])].set(-jnp.inf)


# ----------------------------------------------------------------- greedy

@functools.partial(jax.jit, static_argnames=("config", "capacity"))
def _greedy(params: Params, src: jax.Array, limits: jax.Array, config: Config, capacity: int):
    params = model.cast_params(params, config)
    B = src.shape[0]

    def step(state):
        t, tokens, out, done, cache = state
        logits, cache = model.decoder_stack(params, tokens[:, None], cache, config)           # (B, 1, V)
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


def greedy_search(params: Params, config: Config, src, max_new_tokens: int | None = None) -> jax.Array:
    """Greedy decoding (``spec.search.greedy_search``): src (B, S) int -> tokens (B, L) int32.

    Raises:
        ValueError: from ``spec.validate.check_source`` and ``generation_limits``.
    """
    src = np.asarray(src)
    validate.check_source(src, config)
    limits = validate.generation_limits(src, config, max_new_tokens)
    out, steps = _greedy(params, jnp.asarray(src, jnp.int32), jnp.asarray(limits, jnp.int32), config,
                         _capacity(src, config, max_new_tokens))
    return out[:, :int(steps)]


# ----------------------------------------------------------------- beam

def _top(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """The k largest of x (..., N) in descending order, equal values in ascending index order."""
    return lax.top_k(x, k)


def _take(x: jax.Array, idx: jax.Array) -> jax.Array:
    """x (B, N, ...) gathered along axis 1 by idx (B, M) -> (B, M, ...)."""
    return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1)


@functools.partial(jax.jit, static_argnames=("config", "capacity", "k"))
def _beam(params: Params, src: jax.Array, limits: jax.Array, lp: jax.Array, config: Config, capacity: int, k: int):
    params = model.cast_params(params, config)
    B, V, ninf = src.shape[0], config.vocab_size, -jnp.inf

    def step(state):  # s: per-sequence beam state, arrays with leading axes (B, k)
        t, s, done, cache = state
        logits, cache = model.decoder_stack(params, s["tokens"].reshape(B * k, 1), cache, config)   # (B*k, 1, V)
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


def beam_search(params: Params, config: Config, src, beam_size: int = 4, alpha: float = 0.6,
                max_new_tokens: int | None = None) -> jax.Array:
    """Beam search (``spec.search.beam_search``; paper: beam 4, alpha 0.6): src (B, S) int -> tokens (B, L) int32.

    The batch is searched together; each sequence stops on its own (the spec's
    early-stop rule or its limit) and then keeps its state.

    Raises:
        ValueError: from ``spec.validate.check_source``, ``generation_limits`` and ``check_beam``.
    """
    src = np.asarray(src)
    validate.check_source(src, config)
    limits = validate.generation_limits(src, config, max_new_tokens)
    validate.check_beam(beam_size, alpha, limits)
    beam_size, alpha = int(beam_size), float(alpha)
    capacity = _capacity(src, config, max_new_tokens)
    best, length = _beam(params, jnp.asarray(src, jnp.int32), jnp.asarray(limits, jnp.int32),
                         jnp.asarray(length_penalty_table(capacity, alpha)), config, capacity, beam_size)
    return best[:, :int(length.max())]
