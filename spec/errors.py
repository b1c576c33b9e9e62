"""How far a tensor is from the float64 ("exact") result, in the units the tolerance policy (``spec.tolerance``)
judges it in.

A forward tensor, a loss or a gradient: in units of the dtype's epsilon times the tensor's scale,

    err_eps = |actual - exact| / (EPS[dtype] * rms(exact))

so one unit is about one rounding of a typical element. Weights after Adam steps: in units of the summed learning
rate of those steps (unit "update"), how far the steps may move a weight. NaN counts as an infinite error.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from spec.numerics import EPS


@dataclasses.dataclass(frozen=True)
class ErrorStats:
    """Error of ``actual`` against ``exact`` for one tensor."""
    max_abs: float
    max_eps: float    # max |a - x| / (eps * rms(x))
    rms_eps: float    # rms(a - x) / (eps * rms(x))
    scale: float      # rms(x)
    unit: str         # the dtype whose eps is the unit

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def error_stats(actual: np.ndarray, exact: np.ndarray, dtype: str) -> ErrorStats:
    """Error of ``actual`` against ``exact`` in units of ``EPS[dtype] * rms(exact)``."""
    a = np.asarray(actual, np.float64)
    x = np.asarray(exact, np.float64)
    if a.shape != x.shape:
        raise ValueError(f"shape {a.shape} differs from expected {x.shape}")
    d = np.abs(a - x)
    d = np.where(np.isnan(d), np.inf, d)
    scale = float(np.sqrt(np.mean(x * x))) or 1.0
    unit = EPS[dtype] * scale
    return ErrorStats(float(d.max()), float(d.max() / unit), float(np.sqrt(np.mean(d * d)) / unit), scale, dtype)


def update_error_stats(actual: np.ndarray, exact: np.ndarray, lr_total: float) -> ErrorStats:
    """Error of weights after Adam steps in units of ``lr_total``, the summed learning rate of those steps
    (unit "update"; ``max_eps``/``rms_eps`` are in these units, ``scale`` is ``lr_total``). Zero for no elements.

    Raises:
        ValueError: if the shapes differ or ``lr_total`` is not positive.
    """
    a, x = np.asarray(actual, np.float64), np.asarray(exact, np.float64)
    if a.shape != x.shape:
        raise ValueError(f"shape {a.shape} differs from expected {x.shape}")
    if not lr_total > 0:
        raise ValueError(f"lr_total must be positive, got {lr_total!r}")
    if a.size == 0:
        return ErrorStats(0.0, 0.0, 0.0, float(lr_total), "update")
    d = np.abs(a - x)
    d = np.where(np.isnan(d), np.inf, d)
    return ErrorStats(float(d.max()), float(d.max() / lr_total), float(np.sqrt(np.mean(d * d)) / lr_total),
                      float(lr_total), "update")

