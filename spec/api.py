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

    lm = T.LanguageModel(spec.preset("lm_tiny"), seed=0)   # decoder-only
    logits = lm([[1, 7, 9]])                                # (B, T, V) float32, causal
    new = T.generate(lm, [[1, 7, 9]], max_new_tokens=8, temperature=0.8, top_p=0.9, seed=0)

Arrays are the framework's own (``torch.Tensor``, ``jax.Array``, ``tf.Tensor``); token ids may also be given
as NumPy arrays or nested lists. The exceptions are the search results of ``impl_jax``, which are NumPy int64
arrays: JAX holds int64 only under the process-wide ``jax_enable_x64`` flag, which a library must not set.
Shape letters as ``spec.config``: B batch, S source length, T target length, P cache capacity, D d_model,
H n_heads, K d_k, C d_v, V vocab_size.

Each function's and method's contract is written once, here; an impl's docstring adds only what is particular to
its framework. Every entry point checks its input with ``spec.validate`` before computing anything, so bad input
raises the same ``ValueError`` with the same message in every backend. A backend may add keyword-only arguments
with defaults after the common ones (``device=`` in torch); ``check_api`` enforces the rest.
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
    """The decoder's state for incremental decoding (section 3.1, a few positions per call), fields in the order of
    ``KV_CACHE_FIELDS``, heads-major as the attention products read them (docs/decisions.md, "The KV cache").

    Attributes:
        self_kv: per decoder layer a pair k (B, H, P, K), v (B, H, P, C) in ``config.dtype``, for P = capacity.
        key_mask: (B, P) bool, True at a written non-pad position.
        memory_kv: per decoder layer k (B, H, S, K), v (B, H, S, C): the encoder output's, computed once.
        memory_mask: (B, S) bool, True at a non-pad source position.
        length: the positions written.
    """

    self_kv: Any
    key_mask: Any
    memory_kv: Any
    memory_mask: Any
    length: Any


class Model(Protocol):
    """A Transformer of one impl: ``torch.nn.Module``, a JAX pytree, or a ``tf.Module``; ``config`` is the
    ``spec.config.Config`` it computes by."""

    config: Config

    def __call__(self, src: Any, tgt_in: Any, intermediates: bool = False, *, rng: Any = None) -> Any:
        """The teacher-forced forward pass (section 3, figure 1), without dropout unless given the framework's own
        RNG as the keyword-only ``rng=`` (never a global one, never the module's mode).

        Args:
            src: (B, S) int token ids; tgt_in: (B, T) int, the targets shifted right (BOS first).
            intermediates: also return the tensors of ``spec.shapes.intermediates`` (with dropout, ``dropout=True``:
                each site's keep mask too).
        Returns:
            logits (B, T, V) float32; with ``intermediates``, ``(logits, {name: tensor})``.
        Raises:
            ValueError: bad token ids, an all-padding source, batch sizes that differ (``spec.validate``).
        """

    def encode(self, src: Any) -> Any:
        """The encoder stack (section 3.1): src (B, S) int -> memory (B, S, D) in ``config.dtype``.

        Raises:
            ValueError: as ``__call__`` for ``src``.
        """

    def init_cache(self, memory: Any, src: Any, capacity: int) -> KVCache:
        """An empty ``KVCache`` for ``capacity`` target positions, the cross-attention K/V of ``memory`` computed.

        Args:
            memory: (B, S, D), ``encode(src)``; src: (B, S) int, for the key padding mask; capacity: P >= 1.
        Raises:
            ValueError: as ``encode`` for ``src``, or a capacity outside [1, max_len].
        """

    def decode(self, tokens: Any, cache: KVCache) -> tuple[Any, KVCache]:
        """n new target tokens at positions ``cache.length`` .. ``cache.length + n - 1`` (decoder of section 3.1).

        The cache passed in is consumed: go on with the returned one (torch writes the cache's buffers in place,
        returns a new cache over them and refuses the consumed one with a ``ValueError``; JAX and TensorFlow
        return a new cache and leave the passed one as it was).

        Args:
            tokens: (B, n) int; cache: from ``init_cache`` or the previous ``decode``.
        Returns:
            (logits (B, n, V) float32, the cache holding the n new positions).
        Raises:
            ValueError: bad token ids, a batch other than the cache's, or more positions than its capacity.
        """


class DecoderOnlyModel(Protocol):
    """A decoder-only language model of one impl (``LanguageModel``, ``config.decoder_only``): the decoder stack
    without cross-attention, pre-LN or post-LN as ``config.norm_first`` says, the tied embedding as the output
    projection."""

    config: Config

    def __call__(self, tokens: Any, intermediates: bool = False, *, rng: Any = None) -> Any:
        """The forward pass over whole sequences, causal and with a key padding mask, without dropout unless given
        the framework's own RNG as ``rng=`` (as ``Model.__call__``).

        Args:
            tokens: (B, T) int token ids; logits at position t predict token t + 1.
            intermediates: also return the tensors of ``spec.shapes.intermediates(config, B, 0, T)``.
        Returns:
            logits (B, T, V) float32; with ``intermediates``, ``(logits, {name: tensor})``.
        Raises:
            ValueError: bad token ids (``spec.validate.check_tokens``, named ``tokens``).
        """

    def init_cache(self, batch: int, capacity: int) -> KVCache:
        """An empty ``KVCache`` of ``capacity`` positions for ``batch`` sequences; ``memory_kv`` is empty and
        ``memory_mask`` None (no encoder).

        Raises:
            ValueError: a batch that is not an int >= 1, or a capacity outside [1, max_len].
        """

    def decode(self, tokens: Any, cache: KVCache) -> tuple[Any, KVCache]:
        """As ``Model.decode``: n new tokens at ``cache.length``.. (a prefill is the first call, with a whole
        prompt) -> (logits (B, n, V) float32, the cache holding them)."""


# The module-level functions, as reference signatures: names, argument names, order and defaults.

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


FUNCTIONS: dict[str, Callable] = {f.__name__: f for f in (
    Transformer, LanguageModel, load_weights, save_weights, from_params, params_of, greedy_search, beam_search,
    generate, init_train_state, loss_and_gradients, train_step, lm_loss_and_gradients, lm_train_step,
    save_train_state, load_train_state)}
METHODS: dict[str, dict[str, Callable]] = {
    "Transformer": {name: getattr(Model, name) for name in ("__call__", "encode", "init_cache", "decode")},
    "LanguageModel": {name: getattr(DecoderOnlyModel, name) for name in ("__call__", "init_cache", "decode")}}
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
    for cls_name, methods in METHODS.items():
        cls = getattr(module, cls_name)
        for n, ref in methods.items():
            # torch: nn.Module.__call__ is (*args, **kwargs) and runs ``forward``, whose signature is the real one.
            impl = cls.forward if n == "__call__" and "forward" in vars(cls) else getattr(cls, n)
            problems += _compare(f"{name}.{cls_name}.{n}", impl, ref, skip_self=True)
    fields = getattr(module.KVCache, "_fields", None) or tuple(getattr(module.KVCache, "__dataclass_fields__", ()))
    if tuple(fields) != KV_CACHE_FIELDS:
        problems.append(f"{name}.KVCache fields are {tuple(fields)}, the spec says {KV_CACHE_FIELDS}")
    if not isinstance(module.__version__, str):
        problems.append(f"{name}.__version__ is not a string")
    return problems
