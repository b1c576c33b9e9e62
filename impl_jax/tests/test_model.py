"""The model: shapes and dtypes, masks, the KV cache, the pytree and the caller's jit, validation before
tracing, compilation per shape bucket."""

from __future__ import annotations

import functools
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import impl_jax
from spec import shapes
from spec.config import TINY
from spec.init import init_params
from spec.numerics import np_dtype
from spec.recording import record, recording, scope


def _tol(c) -> float:
    """A loose bound on a logit difference from reordered fp32 sums (a few flipped bf16 roundings)."""
    return 0.1 if c.dtype == "bfloat16" else 1e-4




def test_the_model_is_a_pytree_that_unflattens_without_initialising(tiny):
    leaves, treedef = jax.tree.flatten(tiny)
    assert len(leaves) == len(init_params(TINY, 0))
    zero = jax.tree.map(jnp.zeros_like, tiny)                  # unflattening keeps what it is given
    assert isinstance(zero, impl_jax.Transformer) and zero.config is tiny.config
    assert all(not np.asarray(x).any() for x in jax.tree.leaves(zero))
    assert jax.tree.unflatten(treedef, leaves).embedder is not tiny.embedder


def test_works_under_the_callers_jit_with_the_same_logits(tiny, tokens):
    c = tiny.config
    src, tgt = tokens(c, 1, 2, 7), tokens(c, 2, 2, 5, bos=True)
    src[1, 5:] = c.pad_id
    want = np.asarray(tiny(src, tgt))
    caller_jit = functools.partial(jax.jit, compiler_options=impl_jax.XLA_OPTIONS)  # else XLA skips roundings
    np.testing.assert_array_equal(np.asarray(caller_jit(lambda m, s, t: m(s, t))(tiny, src, tgt)), want)

    @caller_jit
    def step_by_step(m, s, t):
        cache = m.init_cache(m.encode(s), s, 5)
        first, cache = m.decode(t[:, :2], cache)
        rest, _ = m.decode(t[:, 2:], cache)
        return jnp.concatenate([first, rest], axis=1)

    np.testing.assert_allclose(np.asarray(step_by_step(tiny, src, tgt)), want, atol=_tol(c))


@pytest.mark.parametrize("src, pattern", [
    (np.ones((2, 7), np.float32), "src: token ids must be integers"),
    (np.ones((2, 7, 1), np.int32), "src: expected shape"),
    (np.ones((2, TINY.max_len + 1), np.int32), "src: length 65 exceeds max_len"),
], ids=["float_ids", "rank_3", "too_long"])
def test_under_jit_the_static_checks_still_raise(tiny, src, pattern):
    with pytest.raises(ValueError, match=pattern):
        jax.jit(lambda m, s: m(s, s[:, :5]))(tiny, src)


def test_under_jit_the_value_checks_are_skipped(tiny, tokens):
    """Traced ids have no values: an all-padding row cannot be seen, and computes finite logits."""
    c = tiny.config
    src = tokens(c, 1, 2, 7)
    src[1] = c.pad_id
    with pytest.raises(ValueError, match="all padding"):
        tiny(src, src[:, :5])
    assert np.isfinite(np.asarray(jax.jit(lambda m, s: m(s, s[:, :5]))(tiny, src))).all()


def test_intermediates_are_named_and_shaped_as_the_spec_says(tiny, tokens):
    c = tiny.config
    logits, inter = tiny(tokens(c, 1, 2, 7), tokens(c, 2, 2, 5, bos=True), intermediates=True)
    inter["logits"] = logits
    want = shapes.intermediates(c, 2, 7, 5)
    assert sorted(inter) == sorted(want)
    for name, (shape, dtype) in want.items():
        assert inter[name].shape == shape and np.dtype(inter[name].dtype) == np_dtype(dtype), name


def test_recording_collects_nothing_outside_the_forward(tiny, tokens, compiles):
    """``record`` is a no-op while no ``recording`` is open, and a caller's ``recording`` around the model
    collects nothing, even while the forward is traced: the jitted forward records into its own dict."""
    x = jnp.ones(3)
    with scope("encoder"):
        assert record("x", x) is x
    c = tiny.config
    with recording() as rec:
        tiny(tokens(c, 5, 3, 11), tokens(c, 6, 3, 9, bos=True))   # buckets (4, 16, 16): traced in the block
    assert rec == {}
    assert compiles() == ["impl_jax: compiling forward for batch 4, source length 16, target length 16 (buckets)"]




def test_kv_cache_one_token_at_a_time_and_in_chunks_matches_forward(tiny, tokens):
    c = tiny.config
    src, tgt = tokens(c, 5, 2, 7), tokens(c, 6, 2, 5, bos=True)
    tgt[0, 4] = c.pad_id
    full = np.asarray(tiny(src, tgt))
    memory = tiny.encode(src)
    assert memory.shape == (2, 7, c.d_model) and memory.dtype == jnp.bfloat16
    cache = tiny.init_cache(memory, src, capacity=6)
    assert isinstance(cache, impl_jax.KVCache) and cache._fields == (
        "self_kv", "key_mask", "memory_kv", "memory_mask", "length")
    assert cache.self_kv[0][0].shape == (2, c.n_heads, 6, c.d_k) and cache.self_kv[0][1].shape == (
        2, c.n_heads, 6, c.d_v)                                 # heads-major (spec.api)
    assert cache.memory_kv[0][0].shape == (2, c.n_heads, 7, c.d_k) and cache.memory_mask.shape == (2, 7)
    steps = []
    for a, b in ((0, 1), (1, 3), (3, 4), (4, 5)):              # chunks of 1 and 2 tokens
        logits, cache = tiny.decode(tgt[:, a:b], cache)
        steps.append(np.asarray(logits))
    assert int(cache.length) == 5 and cache.key_mask.shape[1] == 6
    np.testing.assert_allclose(np.concatenate(steps, axis=1)[tgt != c.pad_id], full[tgt != c.pad_id], atol=_tol(c))
    with pytest.raises(ValueError, match="exceed the cache capacity 6"):
        tiny.decode(tgt[:, :2], cache)


@pytest.mark.parametrize("call, pattern", [
    (lambda m, s: m(s.astype(np.float32), s), "src: token ids must be integers"),
    (lambda m, s: m(s, np.where(s == s[0, 0], m.config.vocab_size, s)), "tgt_in: token id 61"),
    (lambda m, s: m.encode(jnp.asarray(s) * 0), "src: sequence 0 is all padding"),
    (lambda m, s: m.decode(-s, m.init_cache(m.encode(s), s, 8)), "tokens: token id -"),
    (lambda m, s: m.init_cache(m.encode(s), s, m.config.max_len + 1), "capacity must be"),
], ids=["float_ids", "id_at_vocab_size", "all_pad_device_array", "negative_decode_id", "capacity"])
def test_bad_input_raises_before_tracing(tiny, call, pattern, tokens, compiles):
    ids = tokens(tiny.config, 7, 2, 7)
    tiny.init_cache(tiny.encode(ids), ids, 8)  # the valid calls a case makes before its bad one, compiled first
    before = len(compiles())
    with pytest.raises(ValueError, match=pattern):
        call(tiny, ids)
    assert compiles()[before:] == []


def test_forward_compiles_once_per_bucket_and_logs_it(tiny, tokens, compiles):
    c = tiny.config
    for S in range(9, 17):                                     # source lengths 9..16, targets 3..5: one bucket
        tiny(tokens(c, S, 3, S), tokens(c, S, 3, 3 + S % 3, bos=True))
    tiny(tokens(c, 0, 5, 17), tokens(c, 0, 5, 5, bos=True))      # batch 5 -> 8, source 17 -> 32
    assert compiles() == ["impl_jax: compiling forward for batch 4, source length 16, target length 8 (buckets)",
                     "impl_jax: compiling forward for batch 8, source length 32, target length 8 (buckets)"]


def test_bf16_parameters_in_a_float32_model_compute_in_float32(tiny, tokens):
    c = tiny.config
    m32 = impl_jax.from_params(c.replace(dtype="float32"), impl_jax.params_of(tiny))
    logits, inter = m32(tokens(c, 1, 2, 7), tokens(c, 2, 2, 5, bos=True), intermediates=True)
    assert inter["encoder.out"].dtype == jnp.float32 and logits.dtype == jnp.float32


def test_the_library_changes_no_global_state():
    code = ("import jax; flags = ('jax_enable_x64', 'jax_default_matmul_precision', 'jax_numpy_rank_promotion');"
            "before = [getattr(jax.config, f) for f in flags];"
            "import logging, impl_jax, spec; m = impl_jax.Transformer(spec.TINY, 0); m([[5, 2]], [[1]]);"
            "impl_jax.greedy_search(m, [[5, 2]], 2);"
            "assert [getattr(jax.config, f) for f in flags] == before, before;"
            "assert not logging.getLogger('impl_jax').handlers; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "ok"


def test_jit_skips_no_rounding_of_the_contract(make, tokens):
    """The jitted bf16 forward computes, bit for bit, what its operations compute one at a time: XLA's default
    excess precision skipped the bf16 rounding of residual sums (rule 5) in up to 186 of 256 elements per tensor."""
    m = make("bfloat16")
    c = m.config
    src, tgt = tokens(c, 3, 2, 8), tokens(c, 4, 2, 8, bos=True)
    logits, rec = m(src, tgt, intermediates=True)
    with jax.disable_jit():
        eager_logits, eager = m(src, tgt, intermediates=True)
    differ = {k: int((np.asarray(rec[k]) != np.asarray(eager[k])).sum()) for k in rec}
    assert not any(differ.values()), {k: n for k, n in differ.items() if n}
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(eager_logits))


def test_models_that_differ_in_dropout_alone_share_their_evaluation_programs(tiny, tokens, compiles):
    """Evaluation never draws dropout (section 5.4): a dropout-0 model of the same weights gives the same bits and
    compiles nothing new; a forward with a dropout rng still draws it."""
    c = tiny.config                                                   # dropout 0.1
    plain = impl_jax.from_params(c.replace(dropout=0.0), impl_jax.params_of(tiny))
    src, tgt = tokens(c, 1, 2, 7), tokens(c, 2, 2, 5, bos=True)

    def evaluate(m):
        memory = m.encode(src)
        logits, _ = m.decode(tgt[:, :2], m.init_cache(memory, src, 4))
        return [m(src, tgt), memory, logits, impl_jax.greedy_search(m, src, 3)]

    want, n = evaluate(tiny), len(compiles())
    assert [np.asarray(x).tobytes() for x in evaluate(plain)] == [np.asarray(x).tobytes() for x in want]
    assert compiles()[n:] == []                                       # the programs of the first model serve both
    key = jax.random.key(0)
    assert not np.array_equal(tiny(src, tgt, rng=key), plain(src, tgt, rng=key))
