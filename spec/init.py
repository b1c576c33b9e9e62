"""Deterministic parameter initialisation from an integer seed.

Each tensor draws from its own NumPy ``Generator(PCG64)`` seeded by
``(seed, sha256(name))``, so a tensor's values depend only on the seed and its
name: identical bits on every platform, and unchanged when other tensors are
added. Values are drawn in float64 and rounded (via float32) to ``param_dtype``.
"""

from __future__ import annotations

import hashlib

import numpy as np

from spec.config import Config
from spec.numerics import np_dtype
from spec.schema import ParamSpec, param_specs


def _rng(seed: int, name: str) -> np.random.Generator:
    words = np.frombuffer(hashlib.sha256(name.encode()).digest()[:8], dtype="<u4")
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, *map(int, words)])))


def _uniform(rng: np.random.Generator, shape: tuple[int, ...], limit: float) -> np.ndarray:
    return limit * (2.0 * rng.random(shape) - 1.0)


def _paper_init(s: ParamSpec, rng: np.random.Generator, c: Config) -> np.ndarray:
    if s.kind == "embedding":  # mean 0, variance 1/d_model: U(-a, a) has variance a^2/3
        return _uniform(rng, s.shape, np.sqrt(3.0 / c.d_model))
    if s.kind == "linear":  # Glorot & Bengio (2010) uniform
        return _uniform(rng, s.shape, np.sqrt(6.0 / (s.fan_in + s.fan_out)))
    if s.kind == "norm_scale":
        return np.ones(s.shape)
    return np.zeros(s.shape)  # "bias", "norm_bias"


def _observable_init(s: ParamSpec, rng: np.random.Generator, c: Config) -> np.ndarray:
    # Golden cases must see every parameter: a zero bias or a unit scale would
    # let an implementation that drops it pass.
    if s.kind == "norm_scale":
        return 1.0 + _uniform(rng, s.shape, 0.5)
    if s.kind in ("bias", "norm_bias"):
        return _uniform(rng, s.shape, 0.2)
    return _paper_init(s, rng, c)


def init_params(c: Config, seed: int, *, observable: bool = False) -> dict[str, np.ndarray]:
    """Parameters for config ``c`` from integer ``seed``.

    Args:
        c: the config; tensors get ``c.param_dtype`` (a NumPy/ml_dtypes dtype).
        seed: a non-negative int.
        observable: if True, biases are U(-0.2, 0.2) and LayerNorm scales
            U(0.5, 1.5) instead of 0 and 1, for golden test cases.

    Returns:
        ``{name: array}`` in the order of ``spec.schema.param_specs``. Paper
        initialisation: embedding U(-sqrt(3/D), sqrt(3/D)) (mean 0, variance
        1/D); linear weights Glorot-uniform over (fan_in, fan_out); biases 0;
        LayerNorm scale 1 and bias 0.

    Raises:
        ValueError: if ``seed`` is not a non-negative int.
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    make = _observable_init if observable else _paper_init
    dtype = np_dtype(c.param_dtype)
    return {s.name: make(s, _rng(seed, s.name), c).astype(np.float32).astype(dtype) for s in param_specs(c)}
