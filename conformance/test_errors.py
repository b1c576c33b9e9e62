"""Bad input raises ValueError naming the problem, before any computation, in every entry point."""

from __future__ import annotations

import numpy as np
import pytest

from conformance import golden as G

CASE = "forward_padded_bfloat16"


def _good(case: G.Case) -> tuple[np.ndarray, np.ndarray]:
    return case.inputs["src"].copy(), case.inputs["tgt_in"].copy()


def _all_pad_source(src, tgt_in, c):
    src[1] = c.pad_id
    return src, tgt_in


def _long(src, tgt_in, c):
    return np.ones((src.shape[0], c.max_len + 1), src.dtype), tgt_in


# name -> (make bad (src, tgt_in), message pattern)
BAD_INPUTS = {
    "float_token_ids": (lambda s, t, c: (s.astype(np.float32), t), r"src: token ids must be integers"),
    "bool_token_ids": (lambda s, t, c: (s > 0, t), r"src: token ids must be integers"),
    "id_at_vocab_size": (lambda s, t, c: (np.where(s == s[0, 0], c.vocab_size, s), t),
                         r"src: token id \d+ outside \[0, vocab_size"),
    "negative_id": (lambda s, t, c: (np.where(s == s[0, 0], -1, s), t), r"src: token id -1 outside"),
    "wrong_rank": (lambda s, t, c: (s[0], t), r"src: expected shape \(batch, length\), got rank 1"),
    "empty_sequences": (lambda s, t, c: (s[:, :0], t), r"src: sequences are empty"),
    "empty_batch": (lambda s, t, c: (s[:0], t[:0]), r"src: batch is empty"),
    "length_over_max_len": (_long, r"src: length \d+ exceeds max_len"),
    "all_padding_source": (_all_pad_source, r"src: sequence 1 is all padding"),
    "target_id_out_of_range": (lambda s, t, c: (s, np.where(t == t[0, 1], c.vocab_size + 3, t)),
                               r"tgt_in: token id \d+ outside"),
    "float_target": (lambda s, t, c: (s, t.astype(np.float64)), r"tgt_in: token ids must be integers"),
    "batch_sizes_differ": (lambda s, t, c: (s, t[:1]), r"src and tgt_in batch sizes differ: 3 vs 1"),
    "ragged_rows": (lambda s, t, c: ([list(s[0]), list(s[1][:-1]), list(s[2])], t),
                    r"src: token ids must be a \(batch, length\) array, got rows of different lengths"),
}
SOURCE_ONLY = {k for k, (_, pat) in BAD_INPUTS.items() if pat.startswith("src:")}


def _case():
    return next(c for c in G.all_cases() if c.name == CASE)


@pytest.mark.needs("errors")
@pytest.mark.parametrize("bad", sorted(BAD_INPUTS))
def test_bad_input_forward(bad, model_for):
    case = _case()
    make, pattern = BAD_INPUTS[bad]
    src, tgt_in = make(*_good(case), case.config)
    with pytest.raises(ValueError, match=pattern):
        model_for(case).forward(src, tgt_in)


@pytest.mark.needs("errors")
@pytest.mark.parametrize("entry", ["encode", "greedy", "beam", "decode_steps"])
@pytest.mark.parametrize("bad", sorted(SOURCE_ONLY))
def test_bad_source_other_entry_points(bad, entry, model_for):
    case = _case()
    make, pattern = BAD_INPUTS[bad]
    src, tgt_in = make(*_good(case), case.config)
    model = model_for(case)
    with pytest.raises(ValueError, match=pattern):
        if entry == "decode_steps":
            model.decode_steps(src, tgt_in)
        else:
            getattr(model, entry)(src)


@pytest.mark.needs("errors")
@pytest.mark.parametrize("call, pattern", [
    (lambda m, s: m.greedy(s, max_new_tokens=0), r"max_new_tokens must be a positive int"),
    (lambda m, s: m.beam(s, max_new_tokens=-2), r"max_new_tokens must be a positive int"),
    (lambda m, s: m.greedy(s, max_new_tokens=10_000), r"generation may need 10000 target positions but max_len"),
    (lambda m, s: m.beam(s, beam_size=0), r"beam_size must be a positive int"),
    (lambda m, s: m.beam(s, alpha=-0.5), r"alpha must be a finite float >= 0"),
    (lambda m, s: m.beam(s, alpha=float("nan")), r"alpha must be a finite float >= 0"),
    (lambda m, s: m.beam(s, alpha=True), r"alpha must be a finite float >= 0"),
    (lambda m, s: m.beam(s, alpha=1e6), r"alpha=1000000.0 makes the length penalty .* overflow float32"),
    (lambda m, s: m.beam(s, beam_size=2.0), r"beam_size must be a positive int, got 2.0"),
    (lambda m, s: m.greedy(s, max_new_tokens=True), r"max_new_tokens must be a positive int, got True"),
    (lambda m, s: m.greedy(s, max_new_tokens=np.float64(3)), r"max_new_tokens must be a positive int"),
    (lambda m, s: m.greedy(np.ones((1, 30), np.int64)), r"generation may need 80 target positions but max_len is 64"),
], ids=["greedy_max_new_tokens_0", "beam_max_new_tokens_negative", "max_new_tokens_over_max_len", "beam_size_0",
        "alpha_negative", "alpha_nan", "alpha_bool", "alpha_overflows_length_penalty", "beam_size_float",
        "max_new_tokens_bool", "max_new_tokens_numpy_float", "default_limit_over_max_len"])
def test_bad_generation_arguments(call, pattern, model_for):
    case = _case()
    with pytest.raises(ValueError, match=pattern):
        call(model_for(case), case.inputs["src"])


@pytest.mark.needs("errors")
@pytest.mark.parametrize("capacity, chunks, pattern", [
    (2.5, None, r"capacity must be an int in \[1, max_len=64\], got 2.5"),
    (True, None, r"capacity must be an int in \[1, max_len=64\], got True"),
    (0, None, r"capacity must be an int in \[1, max_len=64\], got 0"),
    (65, None, r"capacity must be an int in \[1, max_len=64\], got 65"),
    (4, [2, 2, 2, 3], r"tokens: 2 new positions after 4 exceed the cache capacity 4"),
], ids=["capacity_float", "capacity_bool", "capacity_0", "capacity_over_max_len", "decode_past_capacity"])
def test_bad_kv_cache_arguments(capacity, chunks, pattern, model_for):
    case = _case()
    with pytest.raises(ValueError, match=pattern):
        model_for(case).decode_steps(*_good(case), chunks=chunks, capacity=capacity)


def test_numpy_integer_arguments_accepted(model_for):
    """NumPy integers count as ints (``spec.validate.is_int``): the same tokens as Python ints."""
    case = _case()
    model, src = model_for(case), case.inputs["src"]
    np.testing.assert_array_equal(model.greedy(src, np.int64(5)), model.greedy(src, 5))
    np.testing.assert_array_equal(model.beam(src, np.int32(2), np.float32(0.5), np.int64(5)),
                                  model.beam(src, 2, float(np.float32(0.5)), 5))
    logits = model.decode_steps(*_good(case), chunks=[np.int64(9)], capacity=np.int64(12))
    assert logits.shape[:2] == case.inputs["tgt_in"].shape


def test_negative_stride_ids_accepted(model_for):
    """Valid ids in any memory layout (a reversed view has negative strides) give the contiguous copy's result."""
    case = _case()
    src, tgt_in = _good(case)
    model = model_for(case)
    view_src, view_tgt = src[::-1], tgt_in[::-1]
    assert view_src.strides[0] < 0
    got, _ = model.forward(view_src, view_tgt)
    want, _ = model.forward(np.ascontiguousarray(view_src), np.ascontiguousarray(view_tgt))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(model.greedy(view_src, 4), model.greedy(np.ascontiguousarray(view_src), 4))
