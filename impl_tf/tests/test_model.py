"""The model: parameter names, shapes and dtypes, masks, the KV cache, validation, and tracing once."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import impl_tf
from spec import reference as ref
from spec import shapes
from spec.numerics import Numerics
from spec.schema import param_specs


def test_variables_are_named_by_the_canonical_names(model, params):
    got = model.parameters()
    assert list(got) == [s.name for s in param_specs(model.config)]
    assert len(model.trainable_variables) == len(got), "the shared embedding must be one variable"
    for name, v in got.items():
        assert v.numpy().tobytes() == params[name].tobytes(), name


def test_forward_matches_the_reference_and_records_every_intermediate(model, params, tokens):
    src, tgt_in = tokens(0, 2, 6), tokens(1, 2, 5, bos=True)
    src[1, 4:] = model.config.pad_id
    logits, rec = model.forward(src, tgt_in, intermediates=True)
    expected = shapes.intermediates(model.config, 2, 6, 5)
    assert set(rec) == set(expected)
    for name, (shape, dtype) in expected.items():
        x = logits if name == "logits" else rec[name]
        assert tuple(x.shape) == shape and x.numpy().dtype == (np.float32 if dtype == "float32" else ml_dtypes.bfloat16)
    want = ref.forward(ref.as_float64(params, model.config), src, tgt_in, model.config, Numerics("bfloat16"))
    assert np.abs(logits.numpy() - want).max() < 0.05


def test_padding_keys_are_masked(model, tokens):
    """A padded row gives what the row without its padding gives alone (up to fp32 summation order)."""
    src, tgt_in = tokens(2, 2, 6), tokens(3, 2, 5, bos=True)
    src[0, 4:], tgt_in[0, 3:] = model.config.pad_id, model.config.pad_id
    padded = model.forward(src, tgt_in).numpy()
    alone = model.forward(src[:1, :4], tgt_in[:1, :3]).numpy()
    assert np.isfinite(padded).all()
    np.testing.assert_allclose(padded[0, :3], alone[0], atol=0.05)


def test_causal_mask(model, tokens):
    src, tgt_in = tokens(4, 1, 6), tokens(5, 1, 5, bos=True)
    a = model.forward(src, tgt_in).numpy()
    tgt_in[0, 3:] = 7
    b = model.forward(src, tgt_in).numpy()
    np.testing.assert_array_equal(a[0, :3], b[0, :3])


def test_kv_cache_step_by_step_equals_one_call(model, tokens):
    src, tgt_in = tokens(6, 2, 6), tokens(7, 2, 5, bos=True)
    full = model.forward(src, tgt_in).numpy()
    cache = model.init_cache(model.encode(src), src, capacity=5)
    steps = []
    for t in range(5):
        logits, cache = model.decode(tgt_in[:, t:t + 1], cache)
        steps.append(logits.numpy())
    assert int(cache.length) == 5
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=0.05)
    with pytest.raises(ValueError, match="exceed the cache capacity 5"):
        model.decode(tgt_in[:, :1], cache)


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
    for call in (lambda: model.encode(src), lambda: model.forward(src, tokens(11, 2, 3)),
                 lambda: impl_tf.greedy_search(model, src), lambda: impl_tf.beam_search(model, src)):
        with pytest.raises(ValueError, match=pattern):
            call()


def test_compiled_functions_trace_once_across_shapes(model, tokens):
    """Shape-polymorphic signatures: new batch sizes and lengths recompile in XLA but never retrace.

    (2, 6, 5) and capacity 5 are the shapes of the tests above, so only one new shape per function compiles.
    """
    for B, S, T in [(2, 6, 5), (1, 3, 2)]:
        model.forward(tokens(B, B, S), tokens(S, B, T, bos=True))
        model.encode(tokens(B, B, S))
    assert model._forward.experimental_get_tracing_count() == 1
    assert model._encode.experimental_get_tracing_count() == 1
    for capacity in (5, 2):
        src = tokens(12, 2, 6)
        cache = model.init_cache(model.encode(src), src, capacity)
        for t in range(capacity):
            _, cache = model.decode(tokens(t, 2, 1), cache)
    assert model._decode.experimental_get_tracing_count() == 1
