"""The encoder-decoder Transformer (Vaswani et al., 2017, section 3) and what it shares with the decoder-only
``impl_torch.lm.LanguageModel``: the module base (``TransformerBase``: the tied embedding, its state_dict names and
casts) and the checked ``decode`` over a KV cache. The stacks, the cache and the unchecked computations on them
are ``impl_torch.stacks``'.

Every public entry point checks its token ids with ``spec.validate`` on a NumPy host copy before converting or
computing anything, so bad input raises the spec's ``ValueError`` with the spec's message; then it calls those
unchecked computations.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

import spec
from impl_torch.inputs import Ids, device_ids, host_ids
from impl_torch.layers import DTYPES, Embedder
from impl_torch.stacks import Decoder, Encoder, KVCache, decoder_logits, encoder_memory, source_cache
from spec import validate
from spec.annotations import Float
from spec.config import Config
from spec.recording import recording

_TIED = {"embedding": "embedder.table", "position_embedding": "embedder.positions", "logits_bias": "embedder.bias"}


class TransformerBase(nn.Module):
    """What ``Transformer`` and ``impl_torch.lm.LanguageModel`` share as modules: ``config``, ``native_bf16``, the
    ``Embedder``'s parameters, of the canonical ``params``, registered here first, by canonical name (``_TIED``; the
    state_dict holds each once), and casts that keep ``config`` true. A subclass adds its stacks of ``params``."""

    def __init__(self, config: Config, params: dict[str, np.ndarray], device: torch.device | str | None,
                 native_bf16: bool):
        super().__init__()
        self.config, self.native_bf16 = config, native_bf16
        e = self.embedder = Embedder(config, params, device, native_bf16=native_bf16)
        self.embedding, self.position_embedding, self.logits_bias = e.table, e.positions, e.bias  # None: option off
        self.register_state_dict_post_hook(_tied_once)
        self.register_load_state_dict_pre_hook(_tied_twice)

    def extra_repr(self) -> str:
        return f"native_bf16={self.native_bf16}"

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> TransformerBase:
        """``nn.Module._apply`` (under ``.to``, ``.cuda``, ``.float``, ...), keeping ``config`` true: a cast to bf16
        or fp32 sets ``config.param_dtype``; the sinusoidal PE table stays fp32 (rule 3) and only moves device.

        Raises:
            ValueError: naming the dtype, for a cast to any other floating-point dtype, before anything changes.
        """
        # What ``fn`` does to a floating-point parameter, seen on an empty one: cast, move, or neither.
        probe = fn(torch.empty(0, dtype=self.embedding.dtype, device=self.embedding.device))
        param_dtype = next((name for name, d in DTYPES.items() if d == probe.dtype), None)
        if param_dtype is None:
            raise ValueError(f"cannot cast the parameters to {probe.dtype}: param_dtype must be one of "
                             f"{tuple(DTYPES)}")
        pe = self.embedder.pe
        super()._apply(fn, recurse)
        self.embedder.pe = None if pe is None else pe.to(probe.device)
        self.config = self.config.replace(param_dtype=param_dtype)
        return self


class Transformer(TransformerBase):
    """The encoder-decoder Transformer of "Attention Is All You Need" (section 3), numerics of ``spec.numerics``.

    ``Transformer(config, seed)`` holds ``spec.init_params(config, seed)`` (drawn with NumPy, not torch's RNG: the
    same bits in every backend); ``params=`` (keyword, ``impl_torch.from_params``) holds given canonical ones
    instead. Parameters are stored in ``config.param_dtype``, activations computed in ``config.dtype``. The
    state_dict keys are the canonical names of ``spec.schema``, the ``Embedder``'s tied ones too (``TransformerBase``).
    ``native_bf16`` (keyword, default False, shown in ``repr``): CPU bf16 products as native bf16 GEMMs instead of
    fp32 GEMMs of the upcast operands (``impl_torch.numerics``). ``.to(device)`` moves it; ``.to(dtype)``,
    ``.float()`` and ``.bfloat16()`` cast the parameters and set ``config.param_dtype`` to match. Dropout
    (section 5.4) draws from ``rng`` (keyword of ``forward``; None, the default, is evaluation). On CUDA, compute
    inside ``impl_torch.numerics_scope()`` to meet the contract.

    Raises:
        ValueError: from ``spec.validate.check_model_kind`` for a decoder-only config, or from
            ``spec.init_params`` if ``seed`` is not a non-negative int.
    """

    def __init__(self, config: Config, seed: int = 0, *, device: torch.device | str | None = None,
                 native_bf16: bool = False, params: dict[str, np.ndarray] | None = None):
        validate.check_model_kind(config, decoder_only=False)
        params = spec.init_params(config, seed) if params is None else params
        super().__init__(config, params, device, native_bf16)
        self.encoder = Encoder(config, params, device, native_bf16=native_bf16)
        self.decoder = Decoder(config, params, device, native_bf16=native_bf16)

    def forward(self, src: Ids, tgt_in: Ids, intermediates: bool = False, *, rng: torch.Generator | None = None
                ) -> Float[Tensor, "B T V"] | tuple[Float[Tensor, "B T V"], dict[str, Tensor]]:
        """Teacher-forced forward (section 3): src (B, S), tgt_in (B, T) int ids -> logits (B, T, V) float32;
        with ``intermediates=True`` also {name: tensor} of ``spec.shapes.intermediates``. Dropout from ``rng``
        (``layers.dropout``), whose keep masks are then among the intermediates (``dropout=True``).

        Raises:
            ValueError: from ``spec.validate.check_forward``.
        """
        validate.check_forward(host_ids(src), host_ids(tgt_in, "tgt_in"), self.config)
        src, tgt_in = device_ids(src, self.embedding.device), device_ids(tgt_in, self.embedding.device)
        # ``record`` is a no-op outside ``recording()``, so one code path serves both.
        with recording() if intermediates else contextlib.nullcontext() as rec:
            cache = source_cache(self, encoder_memory(self, src, rng), src, tgt_in.shape[1])
            logits = decoder_logits(self, tgt_in, cache, rng)
        return (logits, rec) if intermediates else logits

    def encode(self, src: Ids) -> Float[Tensor, "B S D"]:
        """Encoder stack (section 3.1): src (B, S) int ids -> memory (B, S, D) in ``config.dtype``.

        Raises:
            ValueError: from ``spec.validate.check_source``.
        """
        validate.check_source(host_ids(src), self.config)
        return encoder_memory(self, device_ids(src, self.embedding.device))

    def init_cache(self, memory: Float[Tensor, "B S D"], src: Ids, capacity: int) -> KVCache:
        """An empty KV cache for up to ``capacity`` target positions against ``memory`` (B, S, D) of ``src``.

        Raises:
            ValueError: from ``spec.validate.check_source`` and ``check_capacity`` (an int in [1, max_len]).
        """
        validate.check_source(host_ids(src), self.config)
        validate.check_capacity(capacity, self.config)
        return source_cache(self, memory, device_ids(src, self.embedding.device), int(capacity))

    def decode(self, tokens: Ids, cache: KVCache) -> tuple[Float[Tensor, "B n V"], KVCache]:
        """As the module function ``decode``."""
        return decode(self, tokens, cache)


def decode(model: TransformerBase, tokens: Ids, cache: KVCache) -> tuple[Float[Tensor, "B n V"], KVCache]:
    """The ``decode`` method of either model: tokens (B, n) at ``cache.length``.. -> (logits (B, n, V), cache).
    The cache's buffers are written in place (no copy of the prefix per step); the returned ``KVCache`` is a new
    object over them, and the one passed in is marked consumed.

    Raises:
        ValueError: from ``spec.validate.check_decode``, or if ``cache`` was consumed by an earlier ``decode``
            (its buffers hold positions it does not count: decoding from it again would be wrong).
    """
    if vars(cache).get("consumed"):
        raise ValueError("cache: consumed by an earlier decode, which wrote into its buffers; go on with the "
                         "cache that decode returned")
    B, P = cache.key_mask.shape
    validate.check_decode(host_ids(tokens, "tokens"), model.config, B, cache.length, P)
    logits = decoder_logits(model, device_ids(tokens, model.embedding.device), cache)
    after = dataclasses.replace(cache)           # the same buffers, a new owner
    vars(cache)["consumed"] = True               # not a field: the cache's fields stay spec.api's
    return logits, after



def _tied_once(model: TransformerBase, state: dict[str, Tensor], prefix: str, _: object) -> None:
    """The state_dict holds each Embedder parameter once, by its canonical name."""
    for alias in _TIED.values():
        state.pop(f"{prefix}{alias}", None)


def _tied_twice(model: TransformerBase, state: dict[str, Tensor], prefix: str, *_: object) -> None:
    """A canonical state_dict's Embedder parameters load into the tied ones under both their names."""
    state.update({prefix + alias: state[prefix + name] for name, alias in _TIED.items() if prefix + name in state})
