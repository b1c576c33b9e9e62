"""Sampling the next token and generating with the decoder-only model (``spec.sampling``), in JAX's ops, fp32.

``generate`` is one ``lax.while_loop`` program over the decoding step (``impl_jax.stacks.decoder_logits``), as the
searches of ``impl_jax.search``, and returns NumPy int64 tokens as they do. It follows ``spec.sampling.generate``
step for step: one prefill call, then one position per call. The uniforms are ``spec.sampling.uniforms``, drawn on
the host and passed in as fp32; JAX's RNG draws nothing here.

Shapes are static and the rest is data: the batch is padded to the next power of two with rows of ``pad_id`` (done
from the start, dropped from the result), the prompt to its length bucket, the cache capacity P is the bucket of the
longest prompt plus ``max_new_tokens``, and the uniforms and the output have P columns; temperature, top-k, top-p,
``max_new_tokens`` and the prompts' lengths are arguments. So each (batch bucket, prompt bucket, P) compiles once,
logging one line on the ``"impl_jax"`` logger. The prefill call feeds the whole prompt bucket with the positions from
the shortest prompt's length on set to ``pad_id`` (causally hidden, masked keys, overwritten when their position is
decoded), then sets the cache's length back to that length: one program for every shortest length.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from impl_jax import numerics
from impl_jax.inputs import Ids, device_ids, host_ids
from impl_jax.layers import without_dropout
from impl_jax.lm import LanguageModel
from impl_jax.model import log
from impl_jax.stacks import decoder_logits, empty_cache
from spec import sampling, shapes, validate

F32 = jnp.float32


def sample(logits: jax.Array, u: jax.Array, temperature: float | jax.Array, top_k: int | jax.Array | None,
           top_p: float | jax.Array) -> jax.Array:
    """One step's tokens (``spec.sampling.sample``): logits (B, V) float32 with pad and BOS at -inf, u (B,) ->
    tokens (B,) int32. Every argument may be traced. A Python ``top_p`` is compared as the least fp32 >= p, so the
    fp32 cumulative sums meet it as they meet p itself."""
    V, rank = logits.shape[-1], jnp.arange(logits.shape[-1])
    t = jnp.asarray(temperature, F32)                                         # rounded to fp32
    top_p = jnp.asarray(_at_least(top_p) if isinstance(top_p, int | float) else top_p, F32)
    z = _divide(logits, jnp.where(t == 0, 1.0, t))                            # 1. temperature, the fp32 quotient
    order = jnp.argsort(-z, axis=-1, stable=True)                             # descending, ties to the lower id
    zs = jnp.take_along_axis(z, order, axis=-1)
    kept = (rank < (V if top_k is None else top_k)) & jnp.isfinite(zs)       # 2. top-k; pad, BOS never
    e = jnp.where(kept, jnp.exp(zs - zs[:, :1]), 0.0)
    p = _divide(e, e.sum(axis=-1, keepdims=True))                             # 3. softmax, in that order
    cum = jnp.cumsum(p, axis=-1)
    before = jnp.concatenate([jnp.zeros_like(cum[:, :1]), cum[:, :-1]], axis=-1)  # the sum before each position
    kept &= (before < top_p) | (top_p >= 1.0)                                 # 4. top-p: never empty
    n = kept.sum(axis=-1, keepdims=True)
    p = jnp.where(kept, p, 0.0)
    c = jnp.where(rank == n - 1, 1.0, _divide(jnp.cumsum(p, axis=-1), p.sum(axis=-1, keepdims=True)))
    j = jnp.minimum(((c <= u[:, None]) & kept).sum(axis=-1, keepdims=True), n - 1)  # 5. the first c > u
    drawn = jnp.take_along_axis(order, j, axis=-1)[:, 0]
    return jnp.where(t == 0, jnp.argmax(logits, axis=-1), drawn)              # greedy: the first of equal maxima


def generate(model: LanguageModel, prompt: Ids, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, top_p: float = 1.0, seed: int = 0) -> np.ndarray:
    """A continuation of each prompt (``spec.api``, ``spec.sampling.generate``): prompt (B, L) -> tokens (B, N)
    NumPy int64."""
    c = model.config
    validate.check_model_kind(c, decoder_only=True)
    host = host_ids(prompt, c, "prompt")
    lengths = validate.check_prompt(host, c, max_new_tokens)
    sampling.check_sampling(temperature, top_k, top_p, seed)
    (B, _), L = host.shape, int(lengths.max())
    Bb, capacity = shapes.batch_bucket(B), shapes.length_bucket(L + max_new_tokens, c.max_len)
    u = np.zeros((Bb, capacity), np.float32)
    u[:B, :max_new_tokens] = sampling.uniforms(seed, B, max_new_tokens)
    prompt = device_ids(host[:, :L], Bb, shapes.length_bucket(L, c.max_len), c.pad_id)
    top_k = c.vocab_size if top_k is None else min(top_k, c.vocab_size)
    scalars = (np.int32(max_new_tokens), np.float32(temperature), np.int32(top_k), _at_least(top_p))
    out = _generate(without_dropout(model), prompt, np.pad(lengths, (0, Bb - B)).astype(np.int32), u, *scalars)
    out = np.asarray(out)[:B].astype(np.int64)
    return out[:, :int((out != c.pad_id).sum(axis=1).max())]


@numerics.jit
def _generate(model: LanguageModel, prompt: jax.Array, lengths: jax.Array, u: jax.Array, max_new: jax.Array,
              temperature: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """The loop of ``generate``: prompt (B, L) on the buckets, lengths (B,) (0: an added row), uniforms u (B, P)
    whose P fixes the capacity, the sampling arguments as scalars -> tokens (B, P), right-padded."""
    c, (B, L), rows, capacity = model.config, prompt.shape, jnp.arange(prompt.shape[0]), u.shape[1]
    first = jnp.min(jnp.where(lengths > 0, lengths, L))                      # the shortest prompt
    log.info("impl_jax: compiling generate for batch %d, prompt length %d (buckets); capacity %d", B, L, capacity)
    model = jax.tree.map(lambda p: p.astype(c.dtype), model)
    special = jnp.asarray([c.pad_id, c.bos_id])                               # never generated

    def draw(pos, logits, out, done):  # the tokens at position pos from logits (B, V), for the rows past their prompt
        step = pos - lengths                                                  # each row's new token; < 0: prompt
        col = jnp.clip(step, 0, capacity - 1)
        token = sample(logits.at[:, special].set(-jnp.inf), u[rows, col], temperature, top_k, top_p)
        live = (step >= 0) & ~done
        out = out.at[rows, col].set(jnp.where(live, token, out[rows, col]))
        return out, done | (live & ((token == c.eos_id) | (step + 1 == max_new)))

    def step(state):  # feeds position pos (the prompt's token, else the one drawn; pad_id once done), draws pos + 1
        pos, out, done, cache = state
        fed = jnp.where(pos < lengths, prompt[:, jnp.minimum(pos, L - 1)], out[rows, jnp.maximum(pos - lengths, 0)])
        logits, cache = decoder_logits(model, jnp.where(done, c.pad_id, fed)[:, None], cache)  # (B, 1, V)
        return pos + 1, *draw(pos + 1, logits[:, 0], out, done), cache

    prefill = jnp.where(jnp.arange(L) < first, prompt, c.pad_id)              # the columns every prompt covers
    logits, cache = decoder_logits(model, prefill, empty_cache(model, B, capacity), at=first - 1)  # (B, 1, V)
    out, done = draw(first, logits[:, 0],
                     jnp.full((B, capacity), c.pad_id, jnp.int32), lengths == 0)
    _, out, _, _ = lax.while_loop(lambda s: ~s[2].all(), step, (first, out, done, cache._replace(length=first)))
    return out


def _divide(x: jax.Array, d: jax.Array) -> jax.Array:
    """x / d rounded once, d broadcast to x's shape. XLA rewrites a division by a broadcast value as a product with
    its reciprocal, which misses the rounded quotient (as ``layers.dropout`` notes); a divisor of x's shape keeps
    the division."""
    return x / jnp.where(jnp.isnan(x), 1.0, d)


def _at_least(p: float) -> np.float32:
    """The least fp32 >= p: an fp32 sum s is below p exactly when it is below this."""
    p32 = np.float32(p)
    return np.nextafter(p32, np.float32(np.inf)) if p32 < p else p32
