"""The model: weights from a seed, parameter names, shapes and dtypes, masks, the KV cache, validation, tracing
once, and padding to buckets."""

from __future__ import annotations

import gc
import logging
import weakref

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import impl_tf
from spec import api, shapes
from spec import reference as ref
from spec.init import init_params
from spec.numerics import Numerics
from spec.schema import param_specs


def test_variables_are_named_by_the_canonical_names(model, params):
    got = model.params
    assert list(got) == [s.name for s in param_specs(model.config)]
    assert len(model.trainable_variables) == len(got), "the shared embedding must be one variable"
    for name, v in got.items():
        assert v.numpy().tobytes() == params[name].tobytes(), name


def test_forward_matches_the_reference_and_records_every_intermediate(model, params, tokens):
    src, tgt_in = tokens(0, 2, 6), tokens(1, 2, 5, bos=True)
    src[1, 4:] = model.config.pad_id
    logits, rec = model(src, tgt_in, intermediates=True)
    expected = shapes.intermediates(model.config, 2, 6, 5)
    assert set(rec) == set(expected)
    for name, (shape, dtype) in expected.items():
        x = logits if name == "logits" else rec[name]
        assert tuple(x.shape) == shape and x.numpy().dtype == (np.float32 if dtype == "float32" else ml_dtypes.bfloat16)
    want = ref.forward(ref.as_float64(params, model.config), src, tgt_in, model.config, Numerics("bfloat16"))
    assert np.abs(logits.numpy() - want).max() < 0.05


def test_forward_with_rng_drops_out_and_records_the_keep_masks(config, params, tokens):
    """With a seed (``rng=``) the forward drops out at every site of ``spec.shapes.dropout_sites``: it records each
    site's keep mask (bool, the site's real shape) beside its value after dropout, and its logits are the reference's
    replaying those masks. The same seed draws the same masks, another seed others; without one, none is drawn."""
    c = config.replace(dropout=0.25)
    model = impl_tf.from_params(c, params)
    src, tgt_in = tokens(20, 3, 6), tokens(21, 3, 5, bos=True)
    src[1, 4:], tgt_in[2, 3:] = c.pad_id, c.pad_id
    logits, rec = model(src, tgt_in, intermediates=True, rng=[11, 0])
    want = shapes.intermediates(c, 3, 6, 5, dropout=True)
    assert set(rec) == set(want)
    masks = {name: rec[name].numpy() for name in want if name.endswith(".keep")}
    for site in shapes.dropout_sites(c):
        keep = masks[f"{site}.keep"]
        assert keep.dtype == bool and keep.shape == want[site][0], site
        assert 0.6 < keep.mean() < 0.9 and not np.any(rec[site].numpy().astype(np.float32)[~keep]), site
    faithful = ref.Transformer(ref.as_float64(params, c), c, Numerics("bfloat16")).forward(src, tgt_in, rng=masks)
    assert np.abs(logits.numpy() - faithful).max() < 0.05
    again, other = (model(src, tgt_in, intermediates=True, rng=tf.constant(s, tf.int64))[1] for s in ([11, 0], [12, 0]))
    assert all(np.array_equal(masks[k], again[k].numpy()) for k in masks)
    assert not any(np.array_equal(masks[k], other[k].numpy()) for k in masks)
    assert not [k for k in model(src, tgt_in, intermediates=True)[1] if k.endswith(".keep")]
    with pytest.raises(ValueError, match=r"rng must be a stateless seed, \(2,\) int"):
        model(src, tgt_in, rng=11)


def test_decode_rejects_a_batch_size_other_than_the_cache(model, tokens):
    src = tokens(8, 2, 6)
    cache = model.init_cache(model.encode(src), src, capacity=4)
    with pytest.raises(ValueError, match="tokens: batch 3 differs from the cache's 2"):
        model.decode(tokens(9, 3, 1), cache)


@pytest.mark.parametrize("bad, pattern", [
    (lambda s: s.astype(np.float32), "src: token ids must be integers"),
    (lambda s: np.where(s == s[0, 0], 61, s), r"src: token id 61 outside \[0, vocab_size=61\)"),
    (lambda s: s[0], "src: expected shape"),
])
def test_bad_source_raises_the_spec_error(model, tokens, bad, pattern):
    src = bad(tokens(10, 2, 6))
    for call in (lambda: model.encode(src), lambda: model(src, tokens(11, 2, 3)),
                 lambda: impl_tf.greedy_search(model, src), lambda: impl_tf.beam_search(model, src)):
        with pytest.raises(ValueError, match=pattern):
            call()


def test_compiled_functions_trace_once_across_shapes(model, tokens):
    """Shape-polymorphic signatures: new batch sizes and lengths recompile in XLA but never retrace.

    (2, 6, 5) and capacity 5 are the shapes of the tests above, so only one new shape per function compiles.
    """
    for B, S, T in [(2, 6, 5), (1, 3, 2)]:
        model(tokens(B, B, S), tokens(S, B, T, bos=True))
        model.encode(tokens(B, B, S))
    assert model.compiled["forward"].experimental_get_tracing_count() == 1
    assert model.compiled["encode"].experimental_get_tracing_count() == 1
    for capacity in (5, 2):
        src = tokens(12, 2, 6)
        cache = model.init_cache(model.encode(src), src, capacity)
        for t in range(capacity):
            _, cache = model.decode(tokens(t, 2, 1), cache)
    assert model.compiled["decode"].experimental_get_tracing_count() == 1


def test_seed_gives_the_spec_weights(config):
    """``Transformer(config, seed)`` holds ``spec.init_params(config, seed)`` bit for bit, in schema order."""
    model = impl_tf.Transformer(config, seed=3)
    want, got = init_params(config, 3), impl_tf.params_of(model)
    assert model.config == config and list(got) == list(want)
    for name, a in want.items():
        assert got[name].dtype == a.dtype and got[name].tobytes() == a.tobytes(), name
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        impl_tf.Transformer(config, seed=-1)


def test_token_ids_may_be_lists_arrays_or_tensors(model, tokens):
    src, tgt_in = tokens(13, 2, 5), tokens(14, 2, 4, bos=True)
    want = model(src, tgt_in).numpy()
    want_step, _ = model.decode(tgt_in[:, :1], model.init_cache(model.encode(src), src, 4))
    for convert in (lambda x: x.tolist(), tf.constant, lambda x: x.astype(np.int32)):
        np.testing.assert_array_equal(model(convert(src), convert(tgt_in)).numpy(), want)
        cache = model.init_cache(model.encode(convert(src)), convert(src), 4)
        logits, _ = model.decode(convert(tgt_in[:, :1]), cache)
        np.testing.assert_array_equal(logits.numpy(), want_step.numpy())


def test_kv_cache_fields_and_layout(model, tokens):
    """Fields as ``spec.api.KV_CACHE_FIELDS``; per layer heads-major (k, v) pairs (B, H, P, K), (B, H, P, C); masks;
    length."""
    c = model.config
    src, tgt_in = tokens(15, 2, 6), tokens(16, 2, 3, bos=True)
    src[1, 4:] = c.pad_id
    cache = model.init_cache(model.encode(src), src, capacity=7)
    assert impl_tf.KVCache._fields == api.KV_CACHE_FIELDS
    assert len(cache.self_kv) == len(cache.memory_kv) == c.n_decoder_layers
    for (k, v), (mk, mv) in zip(cache.self_kv, cache.memory_kv, strict=True):
        assert (tuple(k.shape), tuple(v.shape)) == ((2, c.n_heads, 7, c.d_k), (2, c.n_heads, 7, c.d_v))
        assert (tuple(mk.shape), tuple(mv.shape)) == ((2, c.n_heads, 6, c.d_k), (2, c.n_heads, 6, c.d_v))
    np.testing.assert_array_equal(cache.memory_mask.numpy(), src != c.pad_id)
    assert not cache.key_mask.numpy().any() and int(cache.length) == 0
    _, cache = model.decode(tgt_in, cache)
    np.testing.assert_array_equal(cache.key_mask.numpy(), np.tile(np.arange(7) < 3, (2, 1)))
    assert int(cache.length) == 3


def test_init_cache_rejects_memory_of_another_shape(model, tokens):
    src = tokens(17, 2, 6)
    memory = model.encode(src)
    for bad in (memory[:, :5], memory[:1], memory[..., :4]):
        with pytest.raises(ValueError, match=r"memory shape .* does not match src shape \(2, 6\) and d_model 32"):
            model.init_cache(bad, src, 4)


def test_shapes_are_padded_to_buckets_and_logged(config, params, tokens, caplog):
    """A fresh model: batches 3..4 and lengths 1..8 compile one forward and one encoder, logged once each at
    INFO on "impl_tf"; a longer source compiles the next bucket; decode logs its own unpadded shapes. Padding
    changes no bf16 result; the fp32 logits may move by an ulp or two, as the contract lets the fp32 summation order
    follow the product's shape (a padded product has more rows: another GEMM blocking, or the upcast path of
    ``numerics.matmul_f32`` instead of bf16 operands)."""
    model = impl_tf.from_params(config.replace(layer_norm_eps=2e-6), params)  # a config no other test compiles for
    with caplog.at_level(logging.INFO, logger="impl_tf"):
        for B, S, T in [(3, 3, 8), (4, 8, 5), (3, 6, 1)]:
            src, tgt_in = tokens(S, B, S), tokens(T, B, T, bos=True)
            src[0, S - 1:] = config.pad_id
            got = model(src, tgt_in).numpy()
            assert got.shape == (B, T, config.vocab_size)
            weights = list(model.params.values())
            ids = (tf.constant(x, tf.int32) for x in (src, tgt_in))
            want = model.compiled["forward"](weights, *ids).numpy()                          # the unpadded program
            np.testing.assert_allclose(got, want, rtol=0, atol=4 * np.finfo(np.float32).eps * np.abs(want).max())
            memory = model.encode(src).numpy()
            assert memory.shape == (B, S, config.d_model)
            np.testing.assert_array_equal(memory, model.compiled["encode"](weights, tf.constant(src, tf.int32)).numpy())
        model(tokens(0, 1, 9), tokens(1, 1, 3, bos=True))
        cache = model.init_cache(model.encode(src), src, 2)  # not padded: the capacity is the caller's
        for t in range(2):
            _, cache = model.decode(tokens(t, 3, 1), cache)
    assert [r.getMessage() for r in caplog.records if r.name == "impl_tf"] == [
        "impl_tf: compiling forward for shape (4, 8, 8)",
        "impl_tf: compiling encode for shape (4, 8)",
        "impl_tf: compiling forward for shape (1, 16, 8)",
        "impl_tf: compiling decode for shape (3, 1, 2, 6)",
    ]


def test_intermediates_are_sliced_to_the_real_shapes(model, tokens):
    src, tgt_in = tokens(18, 3, 5), tokens(19, 3, 2, bos=True)
    logits, rec = model(src, tgt_in, intermediates=True)
    want_logits = model(src, tgt_in).numpy()
    np.testing.assert_array_equal(logits.numpy(), want_logits)
    for name, (shape, _) in shapes.intermediates(model.config, 3, 5, 2).items():
        assert tuple(rec[name].shape) == shape, name


def test_models_of_one_config_share_programs_on_their_own_weights(config, tokens):
    """A second model of a config runs the first one's programs, traced and compiled once, on its own weights: the
    traces capture no model's variables, and a training step of one model leaves the other's logits unchanged."""
    c = config.replace(dtype="float32", param_dtype="float32", layer_norm_eps=1e-5)  # no other test compiles it
    a, b = impl_tf.Transformer(c, seed=0), impl_tf.Transformer(c, seed=1)
    src, tgt_in, tgt_out = tokens(30, 2, 5), tokens(31, 2, 4, bos=True), tokens(32, 2, 4)
    got_a, got_b = a(src, tgt_in).numpy(), b(src, tgt_in).numpy()
    assert not np.array_equal(got_a, got_b)
    impl_tf.train_step(a, impl_tf.init_train_state(a), src, tgt_in, tgt_out)
    np.testing.assert_array_equal(b(src, tgt_in).numpy(), got_b)
    assert not np.array_equal(a(src, tgt_in).numpy(), got_a)
    # a's own weights, by a model of another config whose forward is the same (evaluation has no dropout)
    alone = impl_tf.from_params(c.replace(dropout=0.3), impl_tf.params_of(a))
    np.testing.assert_array_equal(a(src, tgt_in).numpy(), alone(src, tgt_in).numpy())
    impl_tf.train_step(b, impl_tf.init_train_state(b), src, tgt_in, tgt_out)
    for name in ("forward", "loss_and_gradients with dropout (2, 8, 8)", "adam ()"):
        program = a.compiled[name]
        assert program is b.compiled[name] and program.experimental_get_tracing_count() == 1, name
        for fn in program._list_all_concrete_functions():
            assert not [x for x in fn.captured_inputs if x.dtype == tf.resource], name
    held = weakref.ref(a)
    del a, alone
    gc.collect()
    assert held() is None, "a cached program keeps the model that traced it alive"


def test_models_that_differ_in_dropout_alone_share_their_evaluation_programs(config, tokens, caplog):
    """Evaluation never draws dropout (section 5.4): a dropout-0 model of the same weights gives the same bits and
    traces and compiles nothing new; a training step still draws it."""
    c = config.replace(dtype="float32", param_dtype="float32", layer_norm_eps=1e-5)  # the test above's: its programs
    dropping = impl_tf.Transformer(c, seed=2)                                           # serve this one (dropout 0.1)
    plain = impl_tf.from_params(c.replace(dropout=0.0), impl_tf.params_of(dropping))
    src, tgt_in, tgt_out = tokens(40, 2, 5), tokens(41, 2, 4, bos=True), tokens(42, 2, 4)

    def evaluate(m):
        memory = m.encode(src)
        logits, _ = m.decode(tgt_in[:, :2], m.init_cache(memory, src, 4))
        return [m(src, tgt_in), memory, logits, impl_tf.greedy_search(m, src, 3)]

    with caplog.at_level(logging.INFO, logger="impl_tf"):
        want, n = evaluate(dropping), len(caplog.records)
        assert [np.asarray(x).tobytes() for x in evaluate(plain)] == [np.asarray(x).tobytes() for x in want]
        assert caplog.records[n:] == []                             # the programs of the first model serve both
    assert all(plain.compiled[k] is dropping.compiled[k] for k in plain.compiled)
    losses = [impl_tf.train_step(m, impl_tf.init_train_state(m), src, tgt_in, tgt_out)[0] for m in (dropping, plain)]
    assert losses[0].numpy() != losses[1].numpy()
