"""The decoder-only Transformer: the decoder stack of ``impl_torch.stacks`` without cross-attention, over one token
sequence (``config.decoder_only``), with the same KV cache and the same decode path as the encoder-decoder."""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from torch import Tensor

import spec
from impl_torch.inputs import Ids, device_ids, host_ids
from impl_torch.layers import DTYPES
from impl_torch.model import TransformerBase, decode
from impl_torch.stacks import Decoder, KVCache, decoder_logits, empty_cache
from spec import validate
from spec.annotations import Float
from spec.config import Config
from spec.recording import recording


class LanguageModel(TransformerBase):
    """The decoder-only model (``config.decoder_only``) as an ``nn.Module``, numerics of ``spec.numerics``: the
    embedding (tied to the output projection) and the decoder stack, pre-LN or post-LN as ``config.norm_first``
    says. Constructor keywords, state_dict, casts, devices and dropout as ``impl_torch.Transformer``'s.

    Raises:
        ValueError: from ``spec.validate.check_model_kind`` for an encoder-decoder config, or from
            ``spec.init_params`` if ``seed`` is not a non-negative int.
    """

    def __init__(self, config: Config, seed: int = 0, *, device: torch.device | str | None = None,
                 native_bf16: bool = False, params: dict[str, np.ndarray] | None = None):
        validate.check_model_kind(config, decoder_only=True)
        params = spec.init_params(config, seed) if params is None else params
        super().__init__(config, params, device, native_bf16)
        self.decoder = Decoder(config, params, device, native_bf16=native_bf16)

    def forward(self, tokens: Ids, intermediates: bool = False, *, rng: torch.Generator | None = None
                ) -> Float[Tensor, "B T V"] | tuple[Float[Tensor, "B T V"], dict[str, Tensor]]:
        """tokens (B, T) int ids -> logits (B, T, V) float32, causal; with ``intermediates=True`` also {name:
        tensor} of ``spec.shapes.intermediates(config, B, 0, T)``. Dropout from ``rng`` (``layers.dropout``), whose
        keep masks are then among the intermediates.

        Raises:
            ValueError: from ``spec.validate.check_tokens``.
        """
        validate.check_tokens("tokens", host_ids(tokens, "tokens"), self.config)
        tokens = device_ids(tokens, self.embedding.device)
        with recording() if intermediates else contextlib.nullcontext() as rec:
            logits = decoder_logits(self, tokens, _init_cache(self, tokens.shape[0], tokens.shape[1]), rng)
        return (logits, rec) if intermediates else logits

    def init_cache(self, batch: int, capacity: int) -> KVCache:
        """An empty KV cache for ``batch`` sequences of up to ``capacity`` positions, on the model's device.

        Raises:
            ValueError: from ``spec.validate.check_cache_size``.
        """
        validate.check_cache_size(batch, capacity, self.config)
        return _init_cache(self, int(batch), int(capacity))

    def decode(self, tokens: Ids, cache: KVCache) -> tuple[Float[Tensor, "B n V"], KVCache]:
        """As ``impl_torch.model.decode``: the cache's buffers written in place, the cache passed in consumed."""
        return decode(self, tokens, cache)


def _init_cache(model: LanguageModel, batch: int, capacity: int) -> KVCache:
    """The empty cache of ``LanguageModel.init_cache`` (validated sizes), buffers in ``config.dtype``."""
    return empty_cache(model, batch, capacity, DTYPES[model.config.dtype], model.embedding.device)
