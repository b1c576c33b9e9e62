"""The contract's module-level functions (``spec.api``), as reference signatures: names, argument names, order and
defaults, with the one docstring each impl's function refers to."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from spec.api.protocols import DecoderOnlyModel, Model
from spec.config import Config
from spec.training import TrainConfig

__all__ = [
    "Transformer", "LanguageModel", "load_weights", "save_weights", "from_params", "params_of", "greedy_search",
    "beam_search", "generate", "init_train_state", "loss_and_gradients", "train_step", "lm_loss_and_gradients",
    "lm_train_step", "save_train_state", "load_train_state"]

def Transformer(config: Config, seed: int = 0) -> Model:  # noqa: N802  (a class in every impl)
    """A model holding ``spec.init_params(config, seed)``: the same seed gives bit-identical weights in every
    backend (``spec.init``: each tensor from its own generator seeded by the seed and its name)."""


def LanguageModel(config: Config, seed: int = 0) -> DecoderOnlyModel:  # noqa: N802  (a class in every impl)
    """A decoder-only model holding ``spec.init_params(config, seed)``, as ``Transformer``.

    Raises:
        ValueError: a config that is not decoder-only (``spec.validate.check_model_kind``); ``Transformer`` raises
            it for one that is.
    """


def load_weights(path: str | os.PathLike, config: Config | None = None) -> Model:
    """A model from a canonical weights file (``spec.weights_io``): a ``LanguageModel`` for a decoder-only config,
    else a ``Transformer`` (so for ``from_params``).

    Args:
        path: a safetensors file written by any backend's ``save_weights``; config: defaults to the stored one.
    Raises:
        ValueError: a file that is not canonical, or parameters whose names or shapes differ from ``config``'s.
    """


def save_weights(model: Model, path: str | os.PathLike) -> None:
    """Write the model's parameters (``config.param_dtype``, schema order) and config as a canonical safetensors
    file, bit for bit the same from every backend."""


def from_params(config: Config, params: dict[str, np.ndarray]) -> Model:
    """A model holding the canonical ``params``.

    Args:
        config: the model's config; params: {``spec.schema`` name: NumPy array of the schema's shape}.
    Raises:
        ValueError: a missing, extra or misshapen parameter (``spec.schema``).
    """


def params_of(model: Model) -> dict[str, np.ndarray]:
    """The model's parameters as canonical ``{name: numpy array}`` in ``config.param_dtype``, schema order."""


def greedy_search(model: Model, src: Any, max_new_tokens: int | None = None) -> Any:
    """Greedy decoding (``spec.search.greedy_search``), without dropout.

    Args:
        src: (B, S) int; max_new_tokens: the most tokens per row, EOS included (default: the row's non-pad
            source length + 50, section 6.1).
    Returns:
        tokens (B, L) int64, EOS included, right-padded with ``pad_id``.
    Raises:
        ValueError: as ``encode`` for ``src``, a ``max_new_tokens`` that is not a positive int, or a limit over
            ``max_len`` (never silently cut).
    """


def beam_search(model: Model, src: Any, beam_size: int = 4, alpha: float = 0.6,
                max_new_tokens: int | None = None) -> Any:
    """Beam search with the length penalty of Wu et al. (2016) (section 6.1, ``spec.search.beam_search``), without
    dropout.

    Args:
        src: (B, S) int; beam_size: >= 1; alpha: the length penalty's exponent, >= 0; max_new_tokens: as
            ``greedy_search``.
    Returns:
        tokens (B, L) int64, the best hypothesis per row, EOS included, right-padded with ``pad_id``.
    Raises:
        ValueError: as ``greedy_search``, a ``beam_size`` that is not a positive int, or an ``alpha`` that is not
            finite and >= 0 or whose penalty overflows float32.
    """


def generate(model: DecoderOnlyModel, prompt: Any, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, top_p: float = 1.0, seed: int = 0) -> Any:
    """A continuation of each prompt (``spec.sampling.generate``), with the KV cache (one prefill call, then one
    position per call), without dropout: greedy at ``temperature`` 0, else sampled with temperature, top-k and
    top-p in the order ``spec.sampling`` states, from the uniforms ``spec.sampling.uniforms(seed, B,
    max_new_tokens)``: never the framework's RNG, so every backend draws the same tokens.

    Args:
        prompt: (B, L) int, right-padded with ``pad_id``; max_new_tokens: the most tokens per row, EOS included.
        temperature: >= 0; top_k: None (all) or an int >= 1; top_p: in (0, 1]; seed: an int in [0, 2**64).
    Returns:
        tokens (B, N) int64, the new tokens only, EOS included, right-padded with ``pad_id``; N <= max_new_tokens.
    Raises:
        ValueError: from ``spec.validate.check_prompt`` (an empty prompt, one longer than the context left for
            ``max_new_tokens``) and ``spec.sampling.check_sampling``.
    """


def init_train_state(model: Model, train_config: TrainConfig | None = None, seed: int = 0) -> Any:
    """A fresh ``TrainState`` (section 5.3): ``step`` 0, ``train_config`` (default ``TrainConfig()``), Adam's
    zero fp32 moments per canonical parameter, and the dropout RNG, the framework's own, seeded from ``seed``."""


def loss_and_gradients(model: Model, src: Any, tgt_in: Any, tgt_out: Any, label_smoothing: float = 0.1
                       ) -> tuple[Any, dict[str, Any]]:
    """The label-smoothed cross entropy (section 5.4, ``spec.training``) and its gradients, without dropout.

    Args:
        src: (B, S); tgt_in: (B, T); tgt_out: (B, T) int, the targets (pad positions not counted).
    Returns:
        (loss: float32 scalar, {canonical name: float32 gradient of the master weight}, in schema order).
    Raises:
        ValueError: as ``__call__``, a ``tgt_out`` of another shape, or no target that is not padding.
    """


def train_step(model: Model, state: Any, src: Any, tgt_in: Any, tgt_out: Any) -> tuple[Any, Model, Any]:
    """One Adam step (section 5.3) with dropout at ``config.dropout`` (section 5.4) drawn from the state's RNG, never
    a global one. Consumes model and state: go on with the returned ones (torch and TensorFlow update
    them in place and return the same objects, JAX returns new ones).

    Returns:
        (the batch's loss before the update, a float32 scalar; the model; the state, ``step`` + 1).
    Raises:
        ValueError: as ``loss_and_gradients``.
    """


def lm_loss_and_gradients(model: DecoderOnlyModel, tokens: Any, label_smoothing: float = 0.0
                          ) -> tuple[Any, dict[str, Any]]:
    """Next-token prediction: the loss of ``spec.training`` for logits ``model(tokens[:, :-1])`` against targets
    ``tokens[:, 1:]`` (pad targets not counted) and its gradients, without dropout. No label smoothing by default
    (GPT's convention).

    Args:
        tokens: (B, T) int, T >= 2.
    Returns:
        as ``loss_and_gradients``.
    Raises:
        ValueError: from ``spec.validate.check_lm_batch``.
    """


def lm_train_step(model: DecoderOnlyModel, state: Any, tokens: Any) -> tuple[Any, DecoderOnlyModel, Any]:
    """``train_step`` for next-token prediction on tokens (B, T) (``lm_loss_and_gradients``' loss at the state's
    ``train_config.label_smoothing``), with dropout and Adam as ``train_step``.

    Raises:
        ValueError: from ``spec.validate.check_lm_batch``.
    """


def save_train_state(state: Any, path: str | os.PathLike) -> None:
    """Write the state as safetensors: Adam's moments as ``m.<name>`` and ``v.<name>`` (canonical names), the
    step and ``TrainConfig``, and the RNG state in the framework's own form."""


def load_train_state(path: str | os.PathLike, model: Model) -> Any:
    """The ``TrainState`` a file holds; the RNG state of another framework is re-seeded with a warning.

    Raises:
        ValueError: moments whose names or shapes differ from ``model``'s parameters.
    """
