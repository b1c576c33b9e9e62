"""Greedy and beam search: the spec's algorithm step for step, tie rules, output form, one trace, buckets."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

import impl_tf
from spec import reference as ref
from spec import search
from spec.init import init_params
from spec.numerics import Numerics


def test_top_k_puts_the_lower_index_first_under_xla():
    """The tie rule of spec.search rests on tf.math.top_k's documented order; check it compiled too."""
    x = tf.constant([[0.5, 2.0, -np.inf, 2.0, 0.5, 2.0, -np.inf, 0.5] * 8])
    eager = tf.math.top_k(x, 12).indices.numpy()
    compiled = tf.function(lambda x: tf.math.top_k(x, 12).indices, jit_compile=True)(x).numpy()
    want = np.argsort(-x.numpy(), axis=-1, kind="stable")[:, :12]
    np.testing.assert_array_equal(eager, want)
    np.testing.assert_array_equal(compiled, want)


# float32: logits within ~1e-5 of the reference, so a decision margin over 1e-4 fixes the tokens (spec.tolerance).
MARGIN = 1e-4


def _src(tokens, pad_id):
    src = tokens(20, 3, 7)
    src[1, 4:] = pad_id
    return src


def test_greedy_matches_spec_search(model_f32, tokens):
    m, trace = model_f32, {}
    src = _src(tokens, m.config.pad_id)
    got = impl_tf.greedy_search(m, src, max_new_tokens=12).numpy()
    params = ref.as_float64(impl_tf.params_of(m), m.config)
    want = search.greedy_search(params, src, m.config, Numerics("float32"), 12, trace=trace)
    assert got.dtype == np.int64 and trace["margin"] > MARGIN
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("beam_size, alpha", [(4, 0.6), (2, 0.0)])
def test_beam_matches_spec_search(model_f32, tokens, beam_size, alpha):
    m, trace = model_f32, {}
    src = _src(tokens, m.config.pad_id)
    got = impl_tf.beam_search(m, src, beam_size, alpha, max_new_tokens=12).numpy()
    params = ref.as_float64(impl_tf.params_of(m), m.config)
    want = search.beam_search(params, src, m.config, Numerics("float32"), beam_size, alpha, 12, trace=trace)
    assert trace["margin"] > MARGIN
    np.testing.assert_array_equal(got, want)


def _constant_logits_model(config, eos_row: float):
    """A model whose final hidden state is all ones, so logits are the row sums of the embedding.

    The last LayerNorm gets scale 0 and bias 1; the embedding row of EOS is filled with ``eos_row``: 1.0 makes
    EOS the argmax at every step, -1.0 makes it the least likely token.
    """
    p = init_params(config, 1)
    bf16 = p["embedding"].dtype
    emb = p["embedding"].astype(np.float32)
    emb[config.eos_id] = eos_row
    norm = f"decoder.layers.{config.n_decoder_layers - 1}.ffn_norm"
    p.update({"embedding": emb.astype(bf16), f"{norm}.scale": np.zeros(config.d_model, bf16),
              f"{norm}.bias": np.ones(config.d_model, bf16)})
    return impl_tf.from_params(config, p)


def test_rows_stop_at_eos(config):
    model, src = _constant_logits_model(config, 1.0), np.array([[5, 6, 7], [5, 6, 0]])
    np.testing.assert_array_equal(impl_tf.greedy_search(model, src).numpy(), [[config.eos_id]] * 2)
    np.testing.assert_array_equal(impl_tf.beam_search(model, src).numpy(), [[config.eos_id]] * 2)


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_rows_stop_at_their_own_default_limit(config, kind):
    """Without EOS, row b runs to its non-pad source length + 50, then is right-padded."""
    model, src = _constant_logits_model(config, -1.0), np.array([[5, 6, 7], [5, 6, 0]])
    out = (impl_tf.greedy_search(model, src) if kind == "greedy" else impl_tf.beam_search(model, src)).numpy()
    assert out.shape == (2, 53) and out.dtype == np.int64
    assert (out[0] != config.pad_id).all() and (out[1, :52] != config.pad_id).all() and out[1, 52] == config.pad_id
    assert (out != config.eos_id).all()


def test_generation_loops_trace_once_and_compile_per_bucket(config, tokens, caplog):
    """A fresh model: batches 3..4, sources of 5..8 and limits of 3..8 tokens share one compiled loop per kind,
    logged once at INFO on "impl_tf"; the traced Python function runs once per loop."""
    model = impl_tf.Transformer(config.replace(dtype="float32", param_dtype="float32"), seed=0)
    with caplog.at_level(logging.INFO, logger="impl_tf"):
        for B, S, n in [(3, 7, 8), (4, 5, 3), (3, 8, 6)]:
            assert impl_tf.greedy_search(model, tokens(B, B, S), max_new_tokens=n).shape[0] == B
            assert impl_tf.beam_search(model, tokens(B, B, S), beam_size=2, max_new_tokens=n).shape[0] == B
    assert [r.getMessage() for r in caplog.records if r.name == "impl_tf"] == [
        "impl_tf: compiling greedy_search for shape (4, 8, 8)",
        "impl_tf: compiling beam_search (beam 2) for shape (4, 8, 8)",
    ]
    assert model.compiled["greedy_search"].experimental_get_tracing_count() == 1
    assert model.compiled["beam_search (beam 2)"].experimental_get_tracing_count() == 1


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_rows_of_a_padded_batch_give_what_they_give_alone(model_f32, tokens, kind):
    """Batch 3 runs padded to 4 rows and length 9 to 16: each row's tokens are those of the row alone."""
    src = tokens(21, 3, 9)
    src[2, 5:] = model_f32.config.pad_id
    search = impl_tf.greedy_search if kind == "greedy" else impl_tf.beam_search
    batch = search(model_f32, src, max_new_tokens=10).numpy()
    for b in range(3):
        alone = search(model_f32, src[b:b + 1], max_new_tokens=10).numpy()[0]
        np.testing.assert_array_equal(batch[b, :len(alone)], alone)
        assert (batch[b, len(alone):] == model_f32.config.pad_id).all()
