"""The public API that every impl exports (``impl_torch``, ``impl_jax``, ``impl_tf``): one contract, three idioms.

The same lines work in every backend with the import changed::

    import spec
    import impl_torch as T                      # or: import impl_jax as T, import impl_tf as T

    config = spec.preset("tiny")
    model = T.Transformer(config, seed=0)       # the weights of spec.init_params(config, 0), in every backend
    src, tgt_in = [[5, 9, 17, 2]], [[1, 7, 7]]  # (B, S), (B, T) token ids; 0 pad, 1 BOS, 2 EOS
    logits = model(src, tgt_in)                 # (B, T, V) float32, teacher forcing
    tokens = T.beam_search(model, src)          # (B, L) int64: beam 4, alpha 0.6, EOS included
    cache = model.init_cache(model.encode(src), src, capacity=8)
    step_logits, cache = model.decode([[1]], cache)   # (B, 1, V) float32; go on with the returned cache
    T.save_weights(model, "model.safetensors")

Arrays are the framework's own (``torch.Tensor``, ``jax.Array``, ``tf.Tensor``); token ids may also be given
as NumPy arrays or nested lists. The exceptions are the search results of ``impl_jax``, which are NumPy int64
arrays: JAX holds int64 only under the process-wide ``jax_enable_x64`` flag, which a library must not set.

Rules every impl keeps:

- ``Transformer(config, seed=0)`` holds ``spec.init_params(config, seed)``: the same seed gives bit-identical
  weights in every backend. ``model.config`` is the ``spec.config.Config`` the model computes by.
- ``model(src, tgt_in)``: src (B, S), tgt_in (B, T) int ids -> logits (B, T, V) float32; with
  ``intermediates=True`` -> ``(logits, {name: tensor})`` with the tensors of ``spec.shapes.intermediates``.
- ``model.encode(src)`` -> memory (B, S, D) in ``config.dtype``; ``model.init_cache(memory, src, capacity)``
  -> an empty ``KVCache``; ``model.decode(tokens, cache)``: n new tokens (B, n) -> ``(logits (B, n, V)
  float32, cache)``. **The cache passed to decode is consumed**: go on with the returned one (torch writes the
  passed cache in place and returns it; JAX and TensorFlow return a new one).
- ``KVCache`` fields, in this order, the same in every backend (``KV_CACHE_FIELDS``): ``self_kv`` (per decoder
  layer a pair k (B, H, P, K), v (B, H, P, C) for P = capacity positions), ``key_mask`` (B, P) bool, True at a
  written non-pad position, ``memory_kv`` (per decoder layer k (B, H, S, K), v (B, H, S, C), computed once),
  ``memory_mask`` (B, S) bool, True at a non-pad source position, ``length``: the positions written. The cache is
  heads-major, as the attention products read it (the layout chosen: docs/decisions.md, "The KV cache").
- ``greedy_search`` and ``beam_search`` (``spec.search``) return (B, L) int64 tokens, EOS included, right-padded
  with ``pad_id``, and always compute in evaluation mode (no dropout), whatever mode the model is in.
- ``load_weights(path, config=None)`` builds a model from a canonical weights file (``spec.weights_io``);
  ``save_weights(model, path)`` writes one, bit for bit. ``from_params(config, params)`` and
  ``params_of(model)`` convert from and to the canonical ``{name: numpy array}`` (``spec.schema``).
- Bad input raises the spec's ``ValueError`` (``spec.validate``) before any computation, in every backend.
- Training (``spec.training``, section 5): ``init_train_state(model, train_config=None, seed=0)`` -> a
  ``TrainState`` with ``step`` (updates done) and ``train_config`` (a ``spec.training.TrainConfig``), Adam's fp32
  moments per canonical parameter and the dropout RNG (the framework's own generator, seeded from ``seed``);
  ``train_step(model, state, src, tgt_in, tgt_out)`` -> ``(loss, model, state)``: one Adam step in training mode
  (dropout at ``config.dropout``, masks from the state's RNG, never a global one), the loss (a float32 scalar)
  of the batch before the update; it **consumes model and state**: go on with the returned ones (torch and
  TensorFlow update them in place and return the same objects, JAX returns new ones).
  ``loss_and_gradients(model, src, tgt_in, tgt_out, label_smoothing=0.1)`` -> ``(loss, {name: gradient})`` in
  evaluation mode, float32 gradients of the master weights in schema order. ``save_train_state(state, path)`` and
  ``load_train_state(path, model)`` write and read the moments, step and config canonically (safetensors
  ``m.<name>``, ``v.<name>``); the RNG state is the framework's own, re-seeded with a warning across frameworks.

A backend may add keyword-only arguments with defaults after the common ones (``device=`` in torch);
``check_api`` enforces the rest.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from spec.config import Config
from spec.training import TrainConfig

KV_CACHE_FIELDS = ("self_kv", "key_mask", "memory_kv", "memory_mask", "length")


class KVCache(Protocol):
    """The decoder state for incremental decoding (fields as ``KV_CACHE_FIELDS``)."""

    self_kv: Any
    key_mask: Any
    memory_kv: Any
    memory_mask: Any
    length: Any


class Model(Protocol):
    """A Transformer of one impl: ``torch.nn.Module``, a JAX pytree, or a ``tf.Module``."""

    config: Config

    def __call__(self, src: Any, tgt_in: Any, intermediates: bool = False) -> Any:
        """Teacher-forced forward (section 3): src (B, S), tgt_in (B, T) int -> logits (B, T, V) float32."""

    def encode(self, src: Any) -> Any:
        """Encoder stack (section 3.1): src (B, S) int -> memory (B, S, D) in ``config.dtype``."""

    def init_cache(self, memory: Any, src: Any, capacity: int) -> KVCache:
        """An empty KV cache for ``capacity`` target positions; cross-attention K/V of ``memory`` computed once."""

    def decode(self, tokens: Any, cache: KVCache) -> tuple[Any, KVCache]:
        """n new tokens (B, n) at positions ``cache.length``.. -> (logits (B, n, V) float32, the cache to use next)."""


# The module-level functions, as reference signatures: names, argument names, order and defaults.

def Transformer(config: Config, seed: int = 0) -> Model:  # noqa: N802  (a class in every impl)
    """A model holding ``spec.init_params(config, seed)``."""


def load_weights(path: str | os.PathLike, config: Config | None = None) -> Model:
    """A model from a canonical weights file; ``config`` defaults to the stored one (``spec.weights_io``)."""


def save_weights(model: Model, path: str | os.PathLike) -> None:
    """Write the model's parameters and config as a canonical weights file."""


def from_params(config: Config, params: dict[str, np.ndarray]) -> Model:
    """A model holding the canonical ``params`` (``spec.schema`` names, NumPy arrays)."""


def params_of(model: Model) -> dict[str, np.ndarray]:
    """The model's parameters as canonical ``{name: numpy array}`` in ``config.param_dtype``, schema order."""


def greedy_search(model: Model, src: Any, max_new_tokens: int | None = None) -> Any:
    """Greedy decoding (``spec.search.greedy``): src (B, S) -> tokens (B, L) int64."""


def beam_search(model: Model, src: Any, beam_size: int = 4, alpha: float = 0.6,
                max_new_tokens: int | None = None) -> Any:
    """Beam search (``spec.search.beam``): src (B, S) -> tokens (B, L) int64."""


def init_train_state(model: Model, train_config: TrainConfig | None = None, seed: int = 0) -> Any:
    """A fresh ``TrainState``: zero fp32 moments, step 0, the dropout RNG seeded from ``seed`` (section 5.3)."""


def loss_and_gradients(model: Model, src: Any, tgt_in: Any, tgt_out: Any, label_smoothing: float = 0.1
                       ) -> tuple[Any, dict[str, Any]]:
    """Evaluation mode: the label-smoothed loss (float32 scalar) and {canonical name: float32 gradient}."""


def train_step(model: Model, state: Any, src: Any, tgt_in: Any, tgt_out: Any) -> tuple[Any, Model, Any]:
    """One Adam step in training mode -> (loss before the update, model, state); consumes model and state."""


def save_train_state(state: Any, path: str | os.PathLike) -> None:
    """Write Adam's moments (canonical names), the step, the TrainConfig and the RNG state as safetensors."""


def load_train_state(path: str | os.PathLike, model: Model) -> Any:
    """The ``TrainState`` a file holds, checked against ``model``'s parameters."""


FUNCTIONS: dict[str, Callable] = {f.__name__: f for f in (
    Transformer, load_weights, save_weights, from_params, params_of, greedy_search, beam_search,
    init_train_state, loss_and_gradients, train_step, save_train_state, load_train_state)}
METHODS: dict[str, Callable] = {name: getattr(Model, name) for name in ("__call__", "encode", "init_cache", "decode")}
NAMES = (*FUNCTIONS, "KVCache", "TrainState", "__version__")


def _compare(where: str, impl: Callable, ref: Callable, skip_self: bool) -> list[str]:
    """How ``impl``'s signature departs from ``ref``'s: the common parameters first, in order, with the same
    names, kinds and defaults; extras keyword-only with defaults."""
    skip = 1 if skip_self else 0
    got = list(inspect.signature(impl).parameters.values())[skip:]
    want = list(inspect.signature(ref).parameters.values())[skip:]
    problems = []
    for i, w in enumerate(want):
        if i >= len(got):
            problems.append(f"{where}: missing parameter {w.name!r}")
            continue
        g = got[i]
        if (g.name, g.kind, g.default) != (w.name, w.kind, w.default):
            problems.append(f"{where}: parameter {i} is {g} , the spec says {w}")
    for g in got[len(want):]:
        if g.kind != g.KEYWORD_ONLY or g.default is g.empty:
            problems.append(f"{where}: extra parameter {g} must be keyword-only with a default")
    return problems


def check_api(module: ModuleType) -> list[str]:
    """Every departure of an impl module from this API, as readable lines ([] when it conforms)."""
    name = module.__name__
    problems = [f"{name}.{n} is missing" for n in NAMES if not hasattr(module, n)]
    if problems:
        return problems
    for n, ref in FUNCTIONS.items():
        problems += _compare(f"{name}.{n}", getattr(module, n), ref, skip_self=False)
    cls = module.Transformer
    for n, ref in METHODS.items():
        # torch: nn.Module.__call__ is (*args, **kwargs) and runs ``forward``, whose signature is the real one.
        impl = cls.forward if n == "__call__" and "forward" in vars(cls) else getattr(cls, n)
        problems += _compare(f"{name}.Transformer.{n}", impl, ref, skip_self=True)
    fields = getattr(module.KVCache, "_fields", None) or tuple(getattr(module.KVCache, "__dataclass_fields__", ()))
    if tuple(fields) != KV_CACHE_FIELDS:
        problems.append(f"{name}.KVCache fields are {tuple(fields)}, the spec says {KV_CACHE_FIELDS}")
    if not isinstance(module.__version__, str):
        problems.append(f"{name}.__version__ is not a string")
    return problems
