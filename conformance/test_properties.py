"""Properties every backend must have, on models built from the golden weights.

Each compares the backend with itself under a change that must not matter,
allowing the logits tolerance of the matching golden forward case: a backend
may reorder its fp32 sums when shapes change, which can flip a bf16 rounding,
but a broken mask, a cache that drifts or batch rows that leak into each
other shows up as an error many times larger.
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance import golden as G
from spec import golden_cases, shapes, tolerance
from spec import reference as ref
from spec.numerics import Numerics, np_dtype
from spec.validate import generation_limits

DTYPES = ("bfloat16", "float32")
FORWARD_CASE = {"bfloat16": "forward_padded_bfloat16", "float32": "forward_tiny_float32"}


def _case(dtype: str) -> G.Case:
    return next(c for c in G.all_cases() if c.name == FORWARD_CASE[dtype])


def _tol(case: G.Case) -> float:
    return tolerance.logits_tolerance_abs(case.faithful_error("logits"))


def _tokens(case: G.Case, seed: int, B: int, S: int, T: int) -> tuple[np.ndarray, np.ndarray]:
    c, rng = case.config, np.random.default_rng(seed)
    src = rng.integers(3, c.vocab_size, (B, S))
    tgt_in = rng.integers(3, c.vocab_size, (B, T))
    tgt_in[:, 0] = c.bos_id
    return src, tgt_in


def _close(a: np.ndarray, b: np.ndarray, tol: float, what: str) -> None:
    err = float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
    assert err <= tol, f"{what}: max difference {err:.3g} exceeds the logits tolerance {tol:.3g}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_shapes_and_dtypes(dtype, model_for):
    case = _case(dtype)
    c, (B, S), T = case.config, case.inputs["src"].shape, case.inputs["tgt_in"].shape[1]
    logits, inter = model_for(case).forward(case.inputs["src"], case.inputs["tgt_in"], intermediates=True)
    inter["logits"] = logits
    for name, (shape, dt) in shapes.intermediates(c, B, S, T).items():
        assert name in inter, f"missing intermediate {name}"
        assert inter[name].shape == shape, f"{name}: shape {inter[name].shape}, spec says {shape}"
        assert inter[name].dtype == np_dtype(dt), f"{name}: dtype {inter[name].dtype}, spec says {dt}"


@pytest.mark.parametrize("case", G.cases("layer"), ids=lambda c: c.name)
def test_layer_shapes_and_dtypes(case, model_for):
    layer, c = case.meta["layer"], case.config
    dims = {"L": c.max_len} if layer == "positional_encoding" else {}
    for name, entry in shapes.LAYERS[layer]["inputs"].items():
        for axis, n in zip(entry[0], case.inputs[name].shape, strict=True):
            if isinstance(axis, str):
                dims.setdefault(axis, n)
    out = model_for(case).run_layer(layer, case.meta["prefix"], case.inputs)
    for name, entry in shapes.LAYERS[layer]["outputs"].items():
        shape, dt = shapes.resolve(entry, c, **dims)
        assert out[name].shape == shape, f"{layer}.{name}: shape {out[name].shape}, spec says {shape}"
        assert out[name].dtype == np_dtype(dt), f"{layer}.{name}: dtype {out[name].dtype}, spec says {dt}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_causality(dtype, model_for):
    """Changing later target tokens changes no earlier logit."""
    case = _case(dtype)
    src, tgt_a = _tokens(case, 1, 2, 7, 8)
    tgt_b = tgt_a.copy()
    tgt_b[:, 5:] = (tgt_b[:, 5:] + 7 - 3) % (case.config.vocab_size - 3) + 3
    model = model_for(case)
    la, _ = model.forward(src, tgt_a)
    lb, _ = model.forward(src, tgt_b)
    _close(la[:, :5], lb[:, :5], _tol(case), "logits before the changed positions")
    assert np.abs(la[:, 5:] - lb[:, 5:]).max() > 0, "changing target tokens changed no logit at all"


@pytest.mark.parametrize("dtype", DTYPES)
def test_padding_invariance(dtype, model_for):
    """Appending pad tokens to source and target changes no non-pad output."""
    case = _case(dtype)
    pad = case.config.pad_id
    src, tgt_in = _tokens(case, 2, 2, 6, 5)
    src[1, 4:] = pad
    model = model_for(case)
    logits, _ = model.forward(src, tgt_in)
    longer, _ = model.forward(np.pad(src, ((0, 0), (0, 5)), constant_values=pad),
                              np.pad(tgt_in, ((0, 0), (0, 3)), constant_values=pad))
    assert np.isfinite(longer).all(), "logits at padding positions must be finite"
    _close(logits, longer[:, :5], _tol(case), "logits after appending padding")
    memory = model.encode(src)
    longer_memory = model.encode(np.pad(src, ((0, 0), (0, 5)), constant_values=pad))
    valid = src != pad
    _close(memory[valid], longer_memory[:, :6][valid], _tol(case), "encoder output after appending padding")


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_invariance(dtype, model_for):
    """Each row of a batch gives what it gives alone."""
    case = _case(dtype)
    src, tgt_in = _tokens(case, 3, 3, 6, 5)
    src[2, 3:] = case.config.pad_id
    model = model_for(case)
    batch, _ = model.forward(src, tgt_in)
    for b in range(3):
        alone, _ = model.forward(src[b:b + 1], tgt_in[b:b + 1])
        _close(batch[b], alone[0], _tol(case), f"row {b} in a batch of 3 vs alone")


@pytest.mark.parametrize("dtype", DTYPES)
def test_kv_cache_matches_full_recomputation(dtype, model_for):
    """Decoding one token at a time through the KV cache gives the full forward's logits at every step."""
    case = _case(dtype)
    src, tgt_in = case.inputs["src"], case.inputs["tgt_in"]
    model = model_for(case)
    full, _ = model.forward(src, tgt_in)
    steps = model.decode_steps(src, tgt_in)
    valid = tgt_in != case.config.pad_id
    _close(steps[valid], full[valid], _tol(case), "cached decoding vs full forward")


@pytest.mark.parametrize("dtype", DTYPES)
def test_chunked_decoding_matches_full_forward(dtype, model_for):
    """Several tokens per ``decode`` call, into a cache with room to spare, give the full forward's logits."""
    case = _case(dtype)
    src, tgt_in = case.inputs["src"], case.inputs["tgt_in"]
    T = tgt_in.shape[1]
    model = model_for(case)
    full, _ = model.forward(src, tgt_in)
    steps = model.decode_steps(src, tgt_in, chunks=[3, 1, T - 4], capacity=T + 5)
    valid = tgt_in != case.config.pad_id
    _close(steps[valid], full[valid], _tol(case), "decoding in chunks of 3, 1 and the rest vs full forward")


def _row_ends(row: np.ndarray, limit: int, eos_id: int) -> int:
    eos = np.flatnonzero(row == eos_id)
    return eos[0] + 1 if eos.size else limit


def _special_tokens_favoured(case: G.Case) -> tuple:
    """The case's weights changed so that the unrestricted argmax is pad or BOS at (nearly) every step:
    the last LayerNorm's bias gets a large component along u, and E[pad], E[bos] point along u."""
    c, params = golden_cases.case_params(case.meta, case.params)
    params = {k: v.copy() for k, v in params.items()}
    dt = params["embedding"].dtype
    u = np.random.default_rng(0).standard_normal(c.d_model)
    u /= np.linalg.norm(u)
    last = f"decoder.layers.{c.n_decoder_layers - 1}.ffn_norm.bias"
    params[last] = (params[last].astype(np.float64) + 8.0 * u).astype(dt)
    params["embedding"][c.pad_id] = (3.0 * u).astype(dt)
    params["embedding"][c.bos_id] = (2.5 * u).astype(dt)
    return c, params


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_pad_and_bos_never_generated(kind, load_model):
    """Search never emits pad or BOS (``spec.search.forbid_special``), even where the model favours them most."""
    case = next(c for c in G.cases("greedy") if c.config.dtype == "float32")
    c, params = _special_tokens_favoured(case)
    src = case.inputs["src"]
    exact = ref.as_float64(params, c)
    logits = ref.forward(exact, src, np.full((len(src), 1), c.bos_id), c, Numerics("exact"))
    assert (logits[:, 0].argmax(-1) == c.pad_id).all(), "the test model does not favour pad at the first step"
    model = load_model(c, params)
    out = model.greedy(src, 12) if kind == "greedy" else model.beam(src, 3, 0.6, 12)
    for b, row in enumerate(out):
        end = _row_ends(row, 12, c.eos_id)
        bad = sorted({int(t) for t in row[:end]} & {c.pad_id, c.bos_id})
        assert not bad, f"row {b} generated {bad} (pad_id={c.pad_id}, bos_id={c.bos_id}): {row.tolist()}"


@pytest.mark.parametrize("case", G.cases("greedy"), ids=lambda c: c.name)
@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_generation_output_form(kind, case, model_for):
    """Tokens stop at EOS (then only padding) and respect each sequence's limit, on every greedy case (the fp32 and
    the trained bf16 one have rows that end at different lengths)."""
    c, src, n = case.config, case.inputs["src"], case.meta["decode"]["max_new_tokens"]
    model = model_for(case)
    out = model.greedy(src, n) if kind == "greedy" else model.beam(src, max_new_tokens=n)
    limits = generation_limits(src, c, n)
    assert out.ndim == 2 and out.shape[0] == src.shape[0] and np.issubdtype(out.dtype, np.integer)
    for b, row in enumerate(out):
        end = _row_ends(row, limits[b], c.eos_id)
        assert end <= limits[b], f"row {b}: {end} tokens, limit {limits[b]}"
        assert (row[end:] == c.pad_id).all(), f"row {b}: tokens after the end are not padding"


@pytest.mark.parametrize("dtype", DTYPES)
def test_evaluation_never_drops_out(dtype, load_model):
    """Dropout belongs to training (section 5.4): with ``config.dropout`` 0.5 the forward, KV-cache decoding and
    greedy search give what the same weights give with dropout 0, bit for bit."""
    case = _case(dtype)
    c, params = golden_cases.case_params(case.meta, case.params)
    src, tgt_in = case.inputs["src"], case.inputs["tgt_in"]
    plain, dropping = load_model(c.replace(dropout=0.0), params), load_model(c.replace(dropout=0.5), params)
    np.testing.assert_array_equal(dropping.forward(src, tgt_in)[0], plain.forward(src, tgt_in)[0])
    np.testing.assert_array_equal(dropping.decode_steps(src, tgt_in), plain.decode_steps(src, tgt_in))
    np.testing.assert_array_equal(dropping.greedy(src, 6), plain.greedy(src, 6))
