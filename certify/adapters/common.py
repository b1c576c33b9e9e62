"""What every third-party adapter shares: the ``NotSupported`` answers for what a library lacks, and token ids
and activations between NumPy and torch."""

from __future__ import annotations

import platform
from pathlib import Path

import ml_dtypes
import numpy as np
import torch

from conformance.adapters.base import NotSupported
from spec.config import Config

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def require(config: Config, dtypes: tuple[str, ...], kinds: tuple[str, ...], who: str) -> None:
    """Raise ``NotSupported`` unless the config's dtype is one of ``dtypes`` and its kind (``encoder_decoder`` or
    ``decoder_only``) one of ``kinds``."""
    kind = "decoder_only" if config.decoder_only else "encoder_decoder"
    if kind not in kinds:
        raise NotSupported(f"{who} is not a {kind.replace('_', '-')} model")
    if config.dtype not in dtypes:
        raise NotSupported(f"{who} runs {' or '.join(dtypes)} activations here, not {config.dtype}")


def ids(x) -> torch.Tensor:
    """Token ids as an int64 tensor, as a user hands them to the library (no validation: the library's own)."""
    return torch.as_tensor(np.asarray(x).astype(np.int64))


def host(t: torch.Tensor) -> np.ndarray:
    """A torch activation as NumPy in its own dtype (bf16 as ``ml_dtypes.bfloat16``)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(ml_dtypes.bfloat16)
    return t.numpy()


class Unsupported:
    """The protocol's methods a library has no counterpart for, each raising ``NotSupported`` with ``why``."""

    why = "the library has no such function"

    def _no(self, what: str):
        raise NotSupported(f"{what}: {self.why}")

    def forward(self, src, tgt_in, intermediates=False, dropout_seed=None):
        self._no("forward")

    def encode(self, src):
        self._no("encode")

    def decode_steps(self, src, tgt_in, chunks=None, capacity=None):
        self._no("decode through a KV cache")

    def greedy(self, src, max_new_tokens=None):
        self._no("greedy search")

    def beam(self, src, beam_size=4, alpha=0.6, max_new_tokens=None):
        self._no("beam search")

    def generate(self, prompt, max_new_tokens, temperature=1.0, top_k=None, top_p=1.0, seed=0):
        self._no("generate")

    def run_layer(self, layer, prefix, inputs):
        self._no(f"the {layer} layer alone")

    def save(self, path: Path):
        self._no("saving canonical weights")

    def train(self, batches, train_config, record_after):
        self._no("the spec's training step")


def describe(library: str, version: str) -> str:
    """The library, its version, torch's and the CPU's, for the report."""
    named = f"{library} {version}" if version else library
    return f"{named}, torch {torch.__version__} ({torch.get_num_threads()} threads), {platform.machine()}"


def no_sampling(*_args, **_kwargs):
    """``Backend.sample``: the spec's sampling step (``spec.sampling``) draws from a given uniform ``u``; no library
    here takes one."""
    raise NotSupported("the library's sampler draws from its own RNG; the spec's step takes the uniform u")
