"""Dropout compared across backends: where it applies, at what rate and scale, proven on the values.

Each backend runs a forward in training mode (``dropout_seed``: dropout from its own RNG) and records, beside the
intermediates, its keep mask at every dropout site (``spec.shapes.dropout_sites``: both embedding sums and every
sublayer's output before its residual sum, section 5.4). The live oracle (``conformance.oracle``, out of the
mutants' reach) replays those masks, so the backend's logits are judged against the float64 reference given the
same masks, by the tolerance policy of the golden forward cases: a mask applied anywhere else, or scaled otherwise,
changes the logits by far more than rounding. The masks themselves must be the spec's: one per site, Bernoulli at
``config.dropout`` (kept fraction within 6 standard deviations), a different draw at each site and for each seed,
the same for the same seed.
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance.oracle import ref
from spec import shapes, tolerance
from spec.config import TINY
from spec.golden_cases import valid_rows
from spec.init import init_params
from spec.numerics import Numerics

RATE = 0.25       # 1 - RATE is exact in every dtype; a larger rate than the paper's 0.1 drops more elements to see
SEEDS = (11, 12)  # the backend's dropout seeds; the weights' and tokens' seed is fixed below
B, S, T = 3, 9, 8


def _example(dtype: str):
    c = TINY.replace(dropout=RATE, dtype=dtype, param_dtype=dtype)
    rng = np.random.default_rng(2025)
    src, tgt_in = rng.integers(3, c.vocab_size, (B, S)), rng.integers(3, c.vocab_size, (B, T))
    tgt_in[:, 0] = c.bos_id
    src[1, 6:], src[2, 4:], tgt_in[2, 5:] = c.pad_id, c.pad_id, c.pad_id
    return c, init_params(c, 3, observable=True), src, tgt_in


def _masks(rec: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in rec.items() if k.endswith(".keep")}


def _mask_problems(c, rec: dict[str, np.ndarray]) -> list[str]:
    """What is wrong with the recorded masks: sites, shapes and dtypes, the kept fraction, repeated draws."""
    masks, want = _masks(rec), shapes.intermediates(c, B, S, T, dropout=True)
    sites = {f"{s}.keep" for s in shapes.dropout_sites(c)}
    extra, missing = sorted(set(masks) - sites), sorted(sites - set(masks))
    problems = ([f"dropout masks at no dropout site: {extra}"] if extra else []) + \
        ([f"no dropout mask at {missing}"] if missing else [])
    for name in sorted(sites & set(masks)):
        if masks[name].shape != want[name][0] or masks[name].dtype != bool:
            problems.append(f"{name}: {masks[name].dtype}{masks[name].shape}, want bool{want[name][0]}")
    if problems:
        return problems
    kept = np.concatenate([m.ravel() for m in masks.values()])
    sd = np.sqrt(RATE * (1 - RATE) / kept.size)
    if abs(kept.mean() - (1 - RATE)) > 6 * sd:
        problems.append(f"kept fraction {kept.mean():.4f} over {kept.size} elements, want {1 - RATE} +- {6 * sd:.4f}")
    same = [(a, b) for i, a in enumerate(masks) for b in list(masks)[:i]
            if masks[a].shape == masks[b].shape and np.array_equal(masks[a], masks[b])]
    problems += [f"the same mask at {a} and {b}" for a, b in same]
    for site in shapes.dropout_sites(c):  # the site's recorded value is the one after dropout
        if np.any(np.asarray(rec[site], np.float64)[~masks[f"{site}.keep"]] != 0):
            problems.append(f"{site}: non-zero where its mask drops")
    return problems


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_dropout_placement_rate_and_scale(load_model, record, dtype):
    """The backend's training-mode logits against the reference replaying the backend's own masks."""
    c, params, src, tgt_in = _example(dtype)
    model = load_model(c, params)
    logits, rec = model.forward(src, tgt_in, intermediates=True, dropout_seed=SEEDS[0])
    problems = _mask_problems(c, rec)
    assert not problems, "\n  ".join(["dropout masks:", *problems])
    P, masks = ref.as_float64(params, c), _masks(rec)
    exact = ref.Transformer(P, c, Numerics("exact")).forward(src, tgt_in, rng=masks)
    faithful = ref.Transformer(P, c, Numerics(c.dtype)).forward(src, tgt_in, rng=masks)
    exact, faithful, got = (valid_rows(x, tgt_in, c.pad_id) for x in (exact, faithful, logits))
    record({"logits": tolerance.judge(got.astype(np.float64), exact, tolerance.error_stats(faithful, exact, c.dtype))})


def test_dropout_draws_follow_the_seed(load_model):
    """The same seed draws the same masks (a resumed run is reproducible), another seed other masks; evaluation
    (no seed) records none."""
    c, params, src, tgt_in = _example("float32")
    model = load_model(c, params)
    first, again, other = (_masks(model.forward(src, tgt_in, intermediates=True, dropout_seed=s)[1])
                           for s in (SEEDS[0], SEEDS[0], SEEDS[1]))
    assert first and all(np.array_equal(first[k], again[k]) for k in first), "one seed drew different masks"
    assert not all(np.array_equal(first[k], other[k]) for k in first), f"seeds {SEEDS} drew the same masks"
    assert not _masks(model.forward(src, tgt_in, intermediates=True)[1]), "evaluation recorded dropout masks"
