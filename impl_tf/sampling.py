"""Sampling the next token (``spec.sampling``) and ``generate``, the decoder-only model's continuation of prompts:
one compiled ``tf.while_loop`` over the model's decoding step (``impl_tf.stacks.decoder_logits``) and a preallocated KV
cache, as ``impl_tf.search``'s loops.

``sample`` is ``spec.sampling``'s stages in TensorFlow ops, in fp32. The order is ``tf.math.top_k`` over the whole
vocabulary, which is a stable descending sort ("if two elements are equal, the lower-index element appears
first"); top-k, the softmax, top-p and the draw are masks and cumulative sums over that order.

``generate`` follows ``spec.sampling.generate`` step for step, with the uniforms ``spec.sampling.uniforms(seed, B,
max_new_tokens)`` drawn on the host (never TensorFlow's RNG) and passed in as fp32. As in ``impl_tf.search``, the
batch, the prompt length and the cache capacity (the bucket of the longest prompt plus ``max_new_tokens``) are
padded to ``spec.shapes`` buckets, and the sampling settings are arguments of the program: one program per bucket
whatever the settings. Added batch rows are all ``pad_id`` and done from the start. The prefill feeds the prompt
bucket's columns, those from the shortest prompt's length on as ``pad_id``, then sets the cache's length back to
that length: padding after the real positions, masked and later overwritten, changes no real result (the argument
of ``spec.shapes``' buckets).
"""

from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf

from impl_tf.inputs import device_ids, host_ids
from impl_tf.lm import LanguageModel
from impl_tf.programs import IDS, compiled
from impl_tf.stacks import KVCache, decoder_logits, empty_cache
from spec import sampling, shapes, validate
from spec.annotations import Int
from spec.search import forbid_special

NEG_INF = float("-inf")
SCALAR, INT_SCALAR = tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int32)


def sample(logits: tf.Tensor, u: tf.Tensor, temperature, top_k, top_p) -> tf.Tensor:
    """One step's tokens (``spec.sampling.sample``): logits (B, V) float32 with pad and BOS at -inf (the caller's
    ``spec.search.forbid_special``), uniforms u (B,) -> tokens (B,) int32.

    ``temperature`` (0: greedy, the lowest id of the maxima), ``top_k`` (None: all) and ``top_p`` are numbers or
    scalar tensors (a program's arguments); temperature and top_p are rounded to fp32, and every stage computes in
    fp32: the quotient by the temperature, the max-subtracted softmax over the kept tokens, the cumulative sums.
    """
    logits, u = tf.convert_to_tensor(logits, tf.float32), tf.convert_to_tensor(u, tf.float32)
    V = logits.shape[-1]
    temperature, top_p = tf.cast(temperature, tf.float32), tf.cast(top_p, tf.float32)
    top_k = tf.cast(V if top_k is None else top_k, tf.int32)
    greedy = tf.math.top_k(logits, 1).indices[:, 0]
    z, order = tf.math.top_k(logits / tf.where(temperature > 0, temperature, 1.0), V)   # (B, V) descending
    kept = (tf.range(V) < top_k) & (z > NEG_INF)                        # top-k; pad and BOS never
    e = tf.where(kept, tf.exp(z - z[:, :1]), 0.0)
    p = e / tf.reduce_sum(e, axis=-1, keepdims=True)                    # softmax over the kept tokens
    kept &= (top_p >= 1.0) | (tf.cumsum(p, axis=-1, exclusive=True) < top_p)   # top-p: the sum before < p
    p = tf.where(kept, p, 0.0)
    cdf = tf.cumsum(p, axis=-1) / tf.reduce_sum(p, axis=-1, keepdims=True)        # renormalised
    n = tf.reduce_sum(tf.cast(kept, tf.int32), axis=-1)                             # (B,) >= 1
    j = tf.minimum(tf.reduce_sum(tf.cast(kept & (cdf <= u[:, None]), tf.int32), axis=-1), n - 1)
    return tf.where(temperature > 0, tf.gather(order, j, batch_dims=1), greedy)     # the first cdf > u


def generate(model: LanguageModel, prompt, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             top_p: float = 1.0, seed: int = 0) -> Int[tf.Tensor, "B N"]:
    """A continuation of each prompt (``spec.sampling.generate``): -> tokens (B, N) int64, in evaluation mode.

    Raises:
        ValueError: as ``spec.api`` (``spec.validate.check_prompt``, ``spec.sampling.check_sampling``), or for a
            model that is not decoder-only.
    """
    prompt, c = host_ids(prompt, "prompt"), model.config
    validate.check_model_kind(c, decoder_only=True)
    lengths = validate.check_prompt(prompt, c, max_new_tokens)
    sampling.check_sampling(temperature, top_k, top_p, seed)
    B, L, N = len(prompt), int(lengths.max()), int(max_new_tokens)
    size = (shapes.batch_bucket(B), shapes.length_bucket(L, c.max_len), shapes.length_bucket(L + N, c.max_len))
    u = np.zeros(size[::2], np.float32)
    u[:B, :N] = sampling.uniforms(seed, B, N)
    padded_lengths = np.zeros(size[0], np.int32)  # 0: an added row
    padded_lengths[:B] = lengths
    signature = [IDS, tf.TensorSpec([None], tf.int32), tf.TensorSpec([None, None], tf.float32), INT_SCALAR, SCALAR,
                 INT_SCALAR, SCALAR]
    loop = compiled(model, "generate", functools.partial(_generate, model), signature, size, dropout=False)
    out, width = loop(device_ids(prompt[:, :L], *size[:2], c.pad_id), tf.constant(padded_lengths), tf.constant(u),
                      tf.constant(N), tf.constant(temperature, tf.float32),
                      tf.constant(c.vocab_size if top_k is None else min(int(top_k), c.vocab_size)),
                      tf.constant(top_p, tf.float32))
    return tf.cast(out[:B, :int(width)], tf.int64)


def _generate(model: LanguageModel, prompt: tf.Tensor, lengths: tf.Tensor, u: tf.Tensor, max_new: tf.Tensor,
              temperature: tf.Tensor, top_k: tf.Tensor, top_p: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """prompt (B, L) and its lengths (B,) (0: an added row), uniforms u (B, P) whose P fixes the capacity ->
    (tokens (B, P) ``pad_id``-filled past each row's end, the longest row's length)."""
    c = model.config
    (B, L), P = tf.unstack(tf.shape(prompt)), tf.shape(u)[1]
    special = forbid_special(np.zeros(c.vocab_size), c) == NEG_INF           # (V,) True at pad and BOS
    first = tf.reduce_min(tf.where(lengths > 0, lengths, L))                 # the shortest prompt
    prefill = tf.where(tf.range(L) < first, prompt, c.pad_id)               # (B, L)
    logits, cache = decoder_logits(model, prefill, empty_cache(model, B, P), at=first - 1)  # (B, 1, V)
    cache = cache._replace(length=first)

    def step(pos, logits, done, out, self_kv, key_mask, length):
        # the loop carries the cache without its empty memory (a loop variable holds no None)
        t = pos - lengths                                                    # (B,) each row's new token; < 0: prompt
        live = (t >= 0) & ~done
        drawn = sample(tf.where(special, NEG_INF, logits), tf.gather(u, tf.maximum(t, 0), batch_dims=1),
                       temperature, top_k, top_p)
        out = tf.where(live[:, None] & (tf.range(P)[None, :] == t[:, None]), drawn[:, None], out)   # out[b, t] = drawn
        done |= live & ((drawn == c.eos_id) | (t + 1 >= max_new))
        fed = tf.where(t < 0, tf.gather(prompt, tf.minimum(pos, L - 1), axis=1), drawn)  # teacher-forced in the prompt
        fed = tf.where(done, c.pad_id, fed)

        def decode():
            logits, cache = decoder_logits(model, fed[:, None], KVCache(self_kv, key_mask, (), None, length))
            return logits[:, 0], cache.self_kv, cache.key_mask, cache.length

        state = tf.cond(tf.reduce_all(done), lambda: (logits, self_kv, key_mask, length), decode)
        return pos + 1, state[0], done, out, *state[1:]

    state = (first, logits[:, 0], lengths == 0, tf.fill([B, P], c.pad_id), cache.self_kv,
             cache.key_mask, cache.length)
    end = tf.reduce_max(lengths) + max_new
    _, _, _, out, *_ = tf.while_loop(lambda pos, _, done, *__: (pos < end) & ~tf.reduce_all(done), step, state)
    return out, tf.reduce_max(tf.reduce_sum(tf.cast(out != c.pad_id, tf.int32), axis=1))
