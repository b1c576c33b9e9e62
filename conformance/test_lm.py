"""The decoder-only model's properties and input errors, on models built from its golden cases' weights.

As ``test_properties``: each compares the backend with itself under a change that must not matter (a future
token, padding, the other rows of a batch, how positions enter the KV cache), allowing the logits tolerance of the
matching golden forward case; and bad input must raise the spec's ``ValueError`` before any computation.
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance import golden as G
from spec import sampling, shapes, tolerance, validate
from spec.numerics import np_dtype

DTYPES = ("bfloat16", "float32")
FORWARD_CASE = {"bfloat16": "lm_forward_tiny_bfloat16", "float32": "lm_forward_tiny_float32"}


def _case(name: str) -> G.Case:
    return next(c for c in G.all_cases() if c.name == name)


def _setup(dtype: str, model_for):
    case = _case(FORWARD_CASE[dtype])
    return case, model_for(case), tolerance.logits_tolerance_abs(case.faithful_error("logits"))


def _tokens(c, seed: int, B: int, T: int) -> np.ndarray:
    tokens = np.random.default_rng(seed).integers(3, c.vocab_size, (B, T))
    tokens[:, 0] = c.bos_id
    return tokens


def _close(a: np.ndarray, b: np.ndarray, tol: float, what: str) -> None:
    err = float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
    assert err <= tol, f"{what}: max difference {err:.3g} exceeds the logits tolerance {tol:.3g}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_lm_shapes_and_dtypes(dtype, model_for):
    case, model, _ = _setup(dtype, model_for)
    tokens = case.inputs["tokens"]
    logits, inter = model.forward(None, tokens, intermediates=True)
    inter["logits"] = logits
    for name, (shape, dt) in shapes.intermediates(case.config, tokens.shape[0], 0, tokens.shape[1]).items():
        assert name in inter, f"missing intermediate {name}"
        assert inter[name].shape == shape, f"{name}: shape {inter[name].shape}, spec says {shape}"
        assert inter[name].dtype == np_dtype(dt), f"{name}: dtype {inter[name].dtype}, spec says {dt}"
    assert not any(k.startswith(("src_embed", "encoder.")) or ".cross_attn" in k for k in inter), "an encoder"


@pytest.mark.parametrize("dtype", DTYPES)
def test_lm_causality(dtype, model_for):
    """Changing the tokens after position t leaves the logits up to t as they were."""
    case, model, tol = _setup(dtype, model_for)
    a = _tokens(case.config, 1, 2, 9)
    b = a.copy()
    b[:, 5:] = _tokens(case.config, 2, 2, 9)[:, 5:]
    la, lb = model.forward(None, a)[0], model.forward(None, b)[0]
    _close(la[:, :5], lb[:, :5], tol, "logits before the change")
    assert np.abs(la[:, 5:] - lb[:, 5:]).max() > tol, "the changed tokens changed nothing"


@pytest.mark.parametrize("dtype", DTYPES)
def test_lm_padding_and_batch_invariance(dtype, model_for):
    """A row's logits at its real positions are those of the row alone, whatever its padding and other rows."""
    case, model, tol = _setup(dtype, model_for)
    c = case.config
    tokens = _tokens(c, 3, 3, 9)
    tokens[1, 4:], tokens[2, 7:] = c.pad_id, c.pad_id
    batch = model.forward(None, tokens)[0]
    for b, n in enumerate((9, 4, 7)):
        _close(batch[b, :n], model.forward(None, tokens[b:b + 1, :n])[0][0], tol, f"row {b}")


@pytest.mark.parametrize("chunks", ([9], [1] * 9, [3, 1, 5]), ids=("prefill", "one_per_call", "chunks"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_lm_cache_matches_recomputation(dtype, chunks, model_for):
    """Positions fed through the KV cache, in one prefill, one per call or in chunks, give the full forward's
    logits; a cache larger than needed changes nothing."""
    case, model, tol = _setup(dtype, model_for)
    tokens = _tokens(case.config, 4, 2, 9)
    full = model.forward(None, tokens)[0]
    _close(model.decode_steps(None, tokens, chunks=chunks, capacity=16), full, tol, "cached logits")


def test_lm_generate_rows_alone(model_for):
    """Greedy generation of a padded batch gives each row the tokens of its prompt alone; sampled, each row's tokens
    do not depend on the other rows (its uniforms are its own: ``spec.sampling.uniforms``)."""
    case = _case("lm_greedy_tiny_float32")
    model, prompt, c = model_for(case), case.inputs["prompt"], case.config
    n = case.meta["decode"]["max_new_tokens"]
    batch = model.generate(prompt, n, temperature=0.0)
    for b in range(len(prompt)):
        alone = model.generate(prompt[b:b + 1, :int((prompt[b] != c.pad_id).sum())], n, temperature=0.0)[0]
        np.testing.assert_array_equal(batch[b, :len(alone)], alone, err_msg=f"row {b}")
    case = _case("lm_sample_topk_topp_tiny_float32")
    model, prompt, d = model_for(case), case.inputs["prompt"], case.meta["decode"]
    settings = {k: d[k] for k in ("temperature", "top_k", "top_p", "seed")}
    other = prompt.copy()
    other[1:] = prompt[0]                                          # row 0 kept, every other row replaced
    first = model.generate(other, d["max_new_tokens"], **settings)[0]
    np.testing.assert_array_equal(first, case.expected["tokens"][0], err_msg="row 0 with other rows beside it")


BAD_PROMPTS = {
    "empty row": ([[1, 5, 6], [0, 0, 0]], r"prompt: row 1 is empty"),
    "pad inside": ([[1, 0, 6]], r"prompt: row 0 has pad_id=0 before a token"),
    "float ids": ([[1.0, 5.0]], r"prompt: token ids must be integers"),
    "id out of range": ([[1, 99]], r"prompt: token id 99 outside"),
}
BAD_SETTINGS = {
    "temperature < 0": ({"temperature": -1.0}, r"temperature must be a finite number >= 0"),
    "temperature NaN": ({"temperature": float("nan")}, r"temperature must be a finite number >= 0"),
    "temperature 1e-50": ({"temperature": 1e-50}, r"temperature 1e-50 rounds to 0 in float32"),
    "top_k 0": ({"top_k": 0}, r"top_k must be None or an int >= 1"),
    "top_p 0": ({"top_p": 0.0}, r"top_p must lie in \(0, 1\]"),
    "top_p 1.5": ({"top_p": 1.5}, r"top_p must lie in \(0, 1\]"),
    "top_p NaN": ({"top_p": float("nan")}, r"top_p must lie in \(0, 1\]"),
    "seed < 0": ({"seed": -1}, r"seed must be an int in \[0, 2\*\*64\)"),
}


@pytest.mark.needs("errors")
@pytest.mark.parametrize("bad", BAD_PROMPTS, ids=str)
def test_lm_bad_prompt(bad, model_for):
    prompt, pattern = BAD_PROMPTS[bad]
    with pytest.raises(ValueError, match=pattern):
        model_for(_case("lm_greedy_tiny_float32")).generate(np.asarray(prompt), 4)


@pytest.mark.needs("errors")
@pytest.mark.parametrize("bad", BAD_SETTINGS, ids=str)
def test_lm_bad_sampling_settings(bad, model_for):
    settings, pattern = BAD_SETTINGS[bad]
    with pytest.raises(ValueError, match=pattern):
        model_for(_case("lm_greedy_tiny_float32")).generate(np.array([[1, 5]]), 4, **settings)


@pytest.mark.needs("errors")
def test_lm_prompt_longer_than_context(model_for):
    """A prompt that leaves no room for ``max_new_tokens`` in the context is refused, never cut."""
    case = _case("lm_greedy_tiny_float32")
    c = case.config
    prompt = _tokens(c, 5, 1, c.max_len - 2)
    with pytest.raises(ValueError, match=r"prompt: a prompt of 62 tokens and max_new_tokens=3 need 65 positions"):
        model_for(case).generate(prompt, 3)
    with pytest.raises(ValueError, match=r"prompt: length 65 exceeds max_len 64"):
        model_for(case).generate(_tokens(c, 5, 1, c.max_len + 1), 1)


def test_lm_spec_messages_match():
    """The messages above are the spec's own (a backend that raises its own words fails the checks above)."""
    c = _case("lm_greedy_tiny_float32").config
    for prompt, pattern in BAD_PROMPTS.values():
        with pytest.raises(ValueError, match=pattern):
            validate.check_prompt(np.asarray(prompt), c, 4)
    for settings, pattern in BAD_SETTINGS.values():
        args = {"temperature": 1.0, "top_k": None, "top_p": 1.0, "seed": 0, **settings}
        with pytest.raises(ValueError, match=pattern):
            sampling.check_sampling(**args)
