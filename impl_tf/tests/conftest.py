"""Shared fixtures: a one-layer model small enough that each XLA compile takes about a second."""

from __future__ import annotations

import numpy as np
import pytest

import impl_tf
from spec.config import TINY
from spec.init import init_params

CONFIG = TINY.replace(n_encoder_layers=1, n_decoder_layers=1)


@pytest.fixture(scope="session")
def config():
    return CONFIG


@pytest.fixture(scope="session")
def params():
    return init_params(CONFIG, 0, observable=True)


@pytest.fixture(scope="session")
def model(params):
    return impl_tf.from_params(CONFIG, params)


@pytest.fixture(scope="session")
def model_f32():
    """The float32 model, whose logits agree with the reference to ~1e-5: exact token comparisons are sound."""
    c = CONFIG.replace(dtype="float32", param_dtype="float32")
    return impl_tf.from_params(c, init_params(c, 0, observable=True))


@pytest.fixture(scope="session")
def tokens():
    """``tokens(seed, B, L, bos=False)``: random non-special token ids (B, L), optionally starting with BOS."""

    def make(seed: int, B: int, L: int, bos: bool = False) -> np.ndarray:
        ids = np.random.default_rng(seed).integers(3, CONFIG.vocab_size, (B, L))
        if bos:
            ids[:, 0] = CONFIG.bos_id
        return ids

    return make


@pytest.fixture(scope="session")
def copy_task():
    """(src, tgt_in, tgt_out): 4 sequences y of 6 ordinary tokens to copy, src = tgt_out = y + EOS, tgt_in = BOS + y
    (ids of every tiny config)."""
    y = np.random.default_rng(0).integers(3, CONFIG.vocab_size, (4, 6))
    src = np.concatenate([y, np.full((4, 1), CONFIG.eos_id)], 1)
    return src, np.concatenate([np.full((4, 1), CONFIG.bos_id), y], 1), src
