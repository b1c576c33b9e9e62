"""Shared fixtures: a tiny model in each dtype, token batches, and the programs a test compiles."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import impl_jax
from spec.config import TINY


def _make(dtype: str) -> impl_jax.Transformer:
    return impl_jax.Transformer(TINY.replace(dtype=dtype, param_dtype=dtype), 0)


def _tokens(c, seed: int, B: int, L: int, bos: bool = False) -> np.ndarray:
    ids = np.random.default_rng(seed).integers(3, c.vocab_size, (B, L))
    if bos:
        ids[:, 0] = c.bos_id
    return ids


@pytest.fixture(scope="session")
def make():
    """``make(dtype)``: the tiny preset's ``Transformer`` (seed 0) in ``dtype``."""
    return _make


@pytest.fixture(scope="session")
def tokens():
    """``tokens(config, seed, B, L, bos=False)``: random non-special token ids (B, L), optionally after BOS."""
    return _tokens


@pytest.fixture
def compiles(caplog):
    """``compiles()``: the lines logged on the ``"impl_jax"`` logger so far in this test, one per program traced to
    be compiled (each jitted program logs one at INFO when it is traced)."""
    caplog.set_level(logging.INFO, logger="impl_jax")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "impl_jax"]


@pytest.fixture(scope="session")
def tiny():
    """The tiny bf16 model. Tests share its shapes, src (2, 7) and tgt (2, 5), so that each
    compiled program is compiled once (XLA's compile time dominates these tests)."""
    return _make("bfloat16")
