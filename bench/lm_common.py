"""What the decoder-only workloads share across frameworks: the model sizes, the prompts, the subject protocol and
the verdicts on the targets.

Framework-neutral (NumPy only). ``bench.lm_torch``, ``bench.lm_jax`` and ``bench.lm_tf`` build ``LMSubject``s, our
``LanguageModel`` and the framework's stock GPT-2, at the same sizes; ``bench.lm_run`` times them.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

import spec
from spec.config import Config

# The sizes ours and the peers are built at. gpt2_small is GPT-2 small's (spec's preset); gpt2_mini and
# gpt2_micro keep its shape (d_k 64, d_ff = 4 d_model, a 1024-token context) at less depth and width and a smaller
# vocabulary, for CPUs: a B=16 prefill of 512 tokens is 0.24 and 0.07 TFLOP (gpt2_small's: 2.2); lm_tiny is
# for smoke tests.
LM_SIZES: dict[str, Config] = {
    "gpt2_small": spec.preset("gpt2_small"),
    "gpt2_mini": spec.preset("gpt2_small", n_decoder_layers=4, d_model=384, n_heads=6, d_ff=1536, vocab_size=16000),
    "gpt2_micro": spec.preset("gpt2_small", n_decoder_layers=2, d_model=256, n_heads=4, d_ff=1024, vocab_size=8000),
    "lm_tiny": spec.preset("lm_tiny"),
}


def lm_config(size: str, dtype: str) -> Config:
    """The size ``size`` of ``LM_SIZES`` computing in and holding its weights in ``dtype``, without dropout."""
    return LM_SIZES[size].replace(dtype=dtype, param_dtype=dtype, dropout=0.0)


def prompts(config: Config, B: int, L: int, seed: int = 0) -> np.ndarray:
    """(B, L) int64 ordinary tokens (no pad, BOS or EOS): a full-length prompt per row, no padding."""
    low = 1 + max(config.pad_id, config.bos_id, config.eos_id)
    return np.random.default_rng(seed).integers(low, config.vocab_size, (B, L))


class LMSubject(Protocol):
    """One decoder-only model to time: our ``LanguageModel`` or a framework's stock GPT-2. Every method returns only
    once the device has finished."""

    name: str   # "impl_torch", "transformers.GPT2LMHeadModel", ...
    dtype: str  # "bfloat16" or "float32": weights and activations

    def prefill(self, prompt: np.ndarray) -> None:
        """An empty cache of capacity L, then one call over the whole prompt (B, L) -> logits (B, L, V)."""

    def decode_steps(self, prompt: np.ndarray, n: int, capacity: int) -> list[float]:
        """Seconds of each of n greedy one-token steps after an untimed prefill of ``prompt`` (B, L) into a cache
        of ``capacity`` positions (where the framework's cache has one): ``decode`` (or the peer's cached call) and
        the argmax on the host."""

    def generate(self, prompt: np.ndarray, n: int) -> np.ndarray:
        """The library's greedy generation (temperature 0), exactly n new tokens: (B, n)."""


def capacity(config: Config, context: int, steps: int) -> int:
    """The cache capacity of a decode-step measurement: room for the longest context measured plus its steps, so
    the steps at a short context run in the same cache as the steps at the long one (as in one generation)."""
    return min(config.max_len, context + steps)
