"""The inputs of the ``add_norm`` golden layer cases (``spec.golden_recipes``), and what the cancellation cases show.

Rule 6 of ``spec.numerics`` computes LayerNorm's statistics in two passes, the mean and then the mean of
``(x - mean)^2``, in fp32. Where a row's mean dwarfs its spread, a variance taken in one pass, ``E[x^2] - E[x]^2``,
cancels: fp32 holds ``E[x^2]`` to ``2^-23 mean^2``, a large part of the variance, or more than all of it, at a mean
10^3-10^4 times the spread. The ``cancel`` cases give such rows, built so that the two-pass statistics are exact
in fp32 (every partial sum a short binary fraction, in any summation order): the ideal is what a backend following
the contract computes, and each case's ``meta["description"]`` says what that is.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

B, S = 2, 7  # the layer cases' batch and sequence length (``spec.golden_recipes``)

CANCEL_DESCRIPTION = {
    "float32": (
        "LayerNorm of rows whose mean is 1.5e3 to 1.2e4 times their spread. Even positions: an offset c of +-128 "
        "or +-256 plus k * 2^-7, k uniform in -8..8 (a spread near 0.038). Odd positions: c in +-32, +-64, +-128, "
        "+-256, constant but for one element c +- 2^-3 (mean c +- 2^-8, variance 31 * 2^-16). y = 0. Every "
        "partial sum of x and of (x - mean)^2 is exact in fp32, in any order, so the contract's two-pass "
        "statistics are exact and the output is within an fp32 rounding or two of the exact value. A one-pass "
        "E[x^2] - E[x]^2 in fp32 rounds E[x^2] ~ c^2 to 2^-23 c^2 (2^-13 to 2^-7): the variance off by 3% to 33% "
        "or lost; a variance without the mean's subtraction (E[x^2] ~ c^2) shrinks the output by the ratio; an "
        "eps outside the square root moves it by about eps / (2 var), 3e-4 to 1e-3: thousands of fp32 ulps."),
    "bfloat16": (
        "LayerNorm of rows constant but for one element: c in +-127.5, +-255, +-1020 (the largest value of its "
        "binade) and one element one bf16 ulp away, c +- ulp(c): a mean 1465 times the spread. y = 0, so the "
        "residual sum is exact. The contract's two-pass fp32 statistics give the mean c +- ulp/32 and the "
        "variance 31 ulp^2 / 1024 to fp32 precision, and the outputs -+1/sqrt(31) = -+0.180 and +-sqrt(31) = "
        "+-5.568 (times the scale, plus the bias) rounded once to bf16. A one-pass E[x^2] - E[x]^2 in fp32 is off "
        "by 3% (its E[x]^2 ~ c^2 rounded to 2^-23 c^2, a 30th of the variance), 16 bf16 ulps of the output."),
}


def description(layer: str, variant: str, dtype: str) -> dict[str, str]:
    """``{"description": ...}`` for a cancellation case's meta.json, what its inputs show; {} for any other case."""
    return {"description": CANCEL_DESCRIPTION[dtype]} if (layer, variant) == ("add_norm", "cancel") else {}


def add_norm_inputs(act: np.dtype, D: int, rng: np.random.Generator, x: Callable, variant: str
                    ) -> dict[str, np.ndarray]:
    """x, y (B, S, D) in the activation dtype ``act``; ``x(*shape, scale=)`` draws rounded normals from ``rng``."""
    if variant == "large_mean":
        # A mean of 300 beside a spread of 4: a bf16 ulp at 300 is 2, so a mean or variance rounded to bf16
        # (against rule 6) loses the statistics, where fp32 statistics keep them to about 1e-5. y is zero, so that
        # the bf16 residual sum is exact and the output's rounding is the faithful reference's only error.
        return {"x": (300.0 + x(B, S, D, scale=4.0).astype(np.float32)).astype(act), "y": np.zeros((B, S, D), act)}
    if variant == "cancel":
        rows = _cancel_rows_fp32(rng, D) if act == np.float32 else _cancel_rows_bf16(rng, D)
        return {"x": rows.astype(act), "y": np.zeros((B, S, D), act)}  # y zero: the residual sum is exact
    # Variance ~1e-6, comparable to layer_norm_eps: the eps is observable.
    return {"x": x(B, S, D, scale=1e-3), "y": x(B, S, D, scale=1e-3)}


def _one_off(c: np.ndarray, d: np.ndarray, rng: np.random.Generator, D: int) -> np.ndarray:
    """Rows (len(c), D) equal to c but for one element, at a random position, c + d."""
    rows = np.repeat(np.asarray(c, np.float64)[:, None], D, axis=1)
    rows[np.arange(len(c)), rng.integers(0, D, len(c))] += d
    return rows


def _cancel_rows_fp32(rng: np.random.Generator, D: int) -> np.ndarray:
    """(B, S, D): multiples of 2^-7 below 2^9, so that every sum of 32 of them, and of their deviations' squares
    (multiples of 2^-24, summing to under 2^-1), fits fp32's 24 bits: two passes are exact in any order."""
    sign = rng.choice([-1.0, 1.0], (B, S))
    x = np.empty((B, S, D))
    even = sign[:, ::2] * rng.choice([128.0, 256.0], sign[:, ::2].shape)
    x[:, ::2] = even[..., None] + rng.integers(-8, 9, even.shape + (D,)) * 2.0**-7
    odd = (sign[:, 1::2] * rng.choice([32.0, 64.0, 128.0, 256.0], sign[:, 1::2].shape)).ravel()
    x[:, 1::2] = _one_off(odd, rng.choice([-1.0, 1.0], odd.shape) * 2.0**-3, rng, D).reshape(B, -1, D)
    return x


def _cancel_rows_bf16(rng: np.random.Generator, D: int) -> np.ndarray:
    """(B, S, D): the largest ratio of mean to spread bf16 rows of D elements can hold, one element an ulp off."""
    c = (rng.choice([-1.0, 1.0], B * S) * rng.choice([127.5, 255.0, 1020.0], B * S))
    ulp = np.abs(c) / 255.0  # c = 255 ulps: the largest value of its binade, one ulp apart from its neighbours
    return _one_off(c, rng.choice([-1.0, 1.0], B * S) * ulp, rng, D).reshape(B, S, D)
