"""The backend adapter protocol: what the conformance suite asks of a backend.

An adapter is a thin translation between NumPy and a backend's *public* API.
Everything crosses as NumPy: token ids as int arrays (passed through as they
are, so the backend sees a float or out-of-range id and must raise the spec's
``ValueError`` itself), activations in the backend's own dtype (bf16 as
``ml_dtypes.bfloat16``), logits as float32, masks as bool.

A backend module (``conformance/adapters/backend_<name>.py``) defines
``make_backend() -> Backend``.

An implementation that does only part of the contract says so: ``Backend.supports``
names what it can do (a subset of ``CAPABILITIES``), and an adapter raises
``NotSupported`` (from ``load`` or any method) for anything else, such as a config
its model cannot express. Either way the check is reported as "not supported",
never as passed or failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from spec.config import Config
from spec.training import TrainConfig

CAPABILITIES = frozenset({
    "encoder_decoder", "decoder_only",   # the model kinds it can load
    "float32", "bfloat16",               # the activation dtypes (``Config.dtype``) it can run
    "forward",                           # Model.forward, teacher-forced logits
    "intermediates",                     # Model.forward(intermediates=True): the named tensors of spec.shapes
    "encode", "cache",                   # Model.encode; Model.decode_steps through a KV cache
    "greedy", "beam", "generate", "sample",
    "layers",                            # Model.run_layer
    "dropout",                           # Model.forward(dropout_seed=...)
    "train",                             # Model.train
    "save",                              # Model.save
    "errors",                            # the spec's ValueError on bad ids, arguments and weights files
    "api",                               # an impl of spec.api's common API, as the backend's ``module``
})


class NotSupported(Exception):
    """Raised by an adapter for a check its implementation cannot run (a config it cannot express, no KV cache, no
    training): the check is reported as "not supported", never as passed or failed."""


class Model(Protocol):
    """A model built by a backend from one canonical weights file."""

    config: Config

    def forward(self, src: np.ndarray, tgt_in: np.ndarray, intermediates: bool = False,
                dropout_seed: int | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Teacher-forced forward: src (B, S), tgt_in (B, T) -> logits (B, T, V) float32 (a decoder-only model: src
        None, tgt_in its tokens), and,
        if ``intermediates``, the tensors of ``spec.shapes.intermediates`` by name (else {}). With a
        ``dropout_seed``, in training mode: dropout from the backend's own RNG seeded from it (the keep masks
        recorded as ``<site>.keep``)."""

    def encode(self, src: np.ndarray) -> np.ndarray:
        """src (B, S) -> memory (B, S, D)."""

    def decode_steps(self, src: np.ndarray, tgt_in: np.ndarray, chunks: Sequence[int] | None = None,
                     capacity: int | None = None) -> np.ndarray:
        """Feed tgt_in (B, T) through the backend's public KV cache (``init_cache`` of ``capacity``
        positions, default T; cross-attention K/V computed once), one ``decode`` call per chunk of
        ``chunks`` tokens (sizes summing to T; default one token per call); the logits of every
        position concatenated: (B, T, V) float32. A decoder-only model: src None, ``init_cache(B, capacity)``."""

    def greedy(self, src: np.ndarray, max_new_tokens: int | None = None) -> np.ndarray:
        """Greedy search (``spec.search``): src (B, S) -> tokens (B, L) int."""

    def beam(self, src: np.ndarray, beam_size: int = 4, alpha: float = 0.6,
             max_new_tokens: int | None = None) -> np.ndarray:
        """Beam search (``spec.search``): src (B, S) -> tokens (B, L) int."""

    def generate(self, prompt: np.ndarray, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float = 1.0, seed: int = 0) -> np.ndarray:
        """A decoder-only model's ``generate`` (``spec.sampling.generate``): prompt (B, L) -> tokens (B, N) int."""

    def run_layer(self, layer: str, prefix: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One layer of ``spec.shapes.LAYERS`` alone, with the model's parameters under ``prefix``
        (as ``spec.reference.run_layer``)."""

    def save(self, path: Path) -> None:
        """Write the model's weights with the backend's own ``save_weights``."""

    def train(self, batches: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], train_config: TrainConfig,
              record_after: Sequence[int]) -> dict:
        """A training run from this model's weights, which stay as they are: the gradients at the start
        (``loss_and_gradients`` on the first batch, label smoothing of ``train_config``), then one ``train_step`` per
        batch (src, tgt_in, tgt_out) from ``init_train_state(model, train_config, seed=0)``. Returns {"loss": (n,)
        float64, the loss each step returned; "grad": {name: float64 gradient}; f"params_{k}": {name: float64
        weights after step k} for k in ``record_after``}. A decoder-only model's batches are (tokens,), trained by
        ``lm_loss_and_gradients`` and ``lm_train_step``."""


class Backend(Protocol):
    name: str
    supports: frozenset[str]  # a subset of CAPABILITIES; a backend without it (the built-in ones) supports them all

    def load(self, path: Path) -> Model:
        """Build a model from a canonical safetensors file with the backend's own ``load_weights``."""

    def describe(self) -> str:
        """Framework version and device, for the report."""

    def sample(self, logits: np.ndarray, u: np.ndarray, temperature: float, top_k: int | None, top_p: float
               ) -> np.ndarray:
        """The backend's sampling step alone (``spec.sampling.sample``): logits (B, V) float32, u (B,) -> (B,) int."""


def train_through_api(impl, model, batches: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
                      train_config: TrainConfig, record_after: Sequence[int], to_numpy) -> dict:
    """``Model.train`` through an impl's common API (``spec.api``) from ``model``, which it may consume (pass a
    copy); ``to_numpy`` turns a framework array into NumPy."""
    lm = len(batches[0]) == 1  # a decoder-only model's (tokens,)
    grad = (impl.lm_loss_and_gradients if lm else impl.loss_and_gradients)(model, *batches[0],
                                                                           train_config.label_smoothing)[1]
    out = {"grad": {k: to_numpy(g).astype(np.float64) for k, g in grad.items()}, "loss": []}
    state = impl.init_train_state(model, train_config, seed=0)
    for k, batch in enumerate(batches, start=1):
        loss, model, state = (impl.lm_train_step if lm else impl.train_step)(model, state, *batch)
        out["loss"].append(float(loss))
        if k in record_after:
            out[f"params_{k}"] = {n: p.astype(np.float64) for n, p in impl.params_of(model).items()}
    return {**out, "loss": np.array(out["loss"])}
