"""The encoder and decoder stacks (Vaswani et al., 2017, section 3.1): the encoder and decoder layers, the stacks of
N of them, the KV cache their decoder runs on, and the model's computations on validated device ids
(``encoder_memory``, ``empty_cache``, ``source_cache``, ``decoder_logits``: no checks; their callers in model, lm,
search and sampling validate first).

Shape letters of ``spec.config``; the KV cache's layout is ``spec.api``'s, keys and values heads-major (B, H, P, K).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from impl_torch.layers import FeedForward, LayerNorm, MultiHeadAttention, dropout
from spec.annotations import Bool, Float
from spec.config import Config
from spec.recording import record, scope

if TYPE_CHECKING:  # model.py builds on this module: its classes are the callers' models, named for the reader
    from impl_torch.model import Transformer, TransformerBase


@dataclasses.dataclass
class KVCache:
    """Decoder state for incremental decoding (section 3.1), fields in the order of ``spec.api.KV_CACHE_FIELDS``.

    self_kv[l]: layer l's self-attention (k (B, H, P, K), v (B, H, P, C)), preallocated for P target positions
    (the capacity); key_mask (B, P) bool, True at a written non-pad position; memory_kv[l]: layer l's
    cross-attention (k (B, H, S, K), v (B, H, S, C)) of the encoder output, computed once; memory_mask (B, S)
    bool, True at a non-pad source position; ``length``: the positions written. A decoder-only model's cache has
    ``memory_kv`` [] and ``memory_mask`` None. ``decode`` writes the buffers in place and returns a new cache over
    them; the one it was given is consumed."""

    self_kv: list[tuple[Float[Tensor, "B H P K"], Float[Tensor, "B H P C"]]]
    key_mask: Bool[Tensor, "B P"]
    memory_kv: list[tuple[Float[Tensor, "B H S K"], Float[Tensor, "B H S C"]]]
    memory_mask: Bool[Tensor, "B S"] | None
    length: int = 0


def key_padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """(B, L) ids -> (B, L) bool, True where the key is not padding."""
    return ids != pad_id


def causal_mask(start: int, n: int, capacity: int, device: torch.device) -> Tensor:
    """(n, capacity) bool: the query at position start + i may attend keys 0..start + i (section 3.2.3)."""
    q_pos = torch.arange(start, start + n, device=device)[:, None]
    return torch.arange(capacity, device=device)[None, :] <= q_pos


class EncoderLayer(nn.Module):
    """Self-attention then FFN, each with a residual connection and LayerNorm (sections 3.1, 5.4): (B, S, D) ->
    (B, S, D). Post-LN (the paper): ``norm(x + dropout(sublayer(x)))``; pre-LN (``config.norm_first``):
    ``x + dropout(sublayer(norm(x)))``. Records each sublayer's output after dropout as ``<name>`` (``dropout``)
    and the residual line's as ``<name>.residual``, relative to the layer (the stack scopes)."""

    def __init__(self, config: Config, params: dict[str, np.ndarray], name: str,
                 device: torch.device | str | None = None, *, native_bf16: bool = False):
        super().__init__()
        attention = lambda a: MultiHeadAttention(config, params, f"{name}.{a}", device, native_bf16=native_bf16)  # noqa: E731
        norm = lambda a: LayerNorm(config, params, f"{name}.{a}", device)  # noqa: E731
        self.self_attn, self.self_attn_norm = attention("self_attn"), norm("self_attn_norm")
        self.ffn = FeedForward(config, params, f"{name}.ffn", device, native_bf16=native_bf16)
        self.ffn_norm = norm("ffn_norm")
        self.norm_first, self.rate = config.norm_first, config.dropout

    def forward(self, x: Tensor, mask: Tensor, rng: torch.Generator | None = None) -> Tensor:
        """x (B, S, D), mask (B, 1, 1, S) key padding mask."""
        h = self.self_attn_norm(x) if self.norm_first else x
        h = self.self_attn(h, self.self_attn.project_kv(h), mask)
        x = x + dropout(h, "self_attn", self.rate, rng)
        x = record("self_attn.residual", x if self.norm_first else self.self_attn_norm(x))
        h = self.ffn(self.ffn_norm(x) if self.norm_first else x)
        x = x + dropout(h, "ffn", self.rate, rng)
        return record("ffn.residual", x if self.norm_first else self.ffn_norm(x))


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder output, FFN (section 3.1), each with its residual
    line as ``EncoderLayer``'s: (B, n, D) -> (B, n, D). A decoder-only model's layer (``config.decoder_only``) has
    no cross-attention (``cross_attn`` and ``cross_attn_norm`` None)."""

    def __init__(self, config: Config, params: dict[str, np.ndarray], name: str,
                 device: torch.device | str | None = None, *, native_bf16: bool = False):
        super().__init__()
        attention = lambda a: MultiHeadAttention(config, params, f"{name}.{a}", device, native_bf16=native_bf16)  # noqa: E731
        norm = lambda a: LayerNorm(config, params, f"{name}.{a}", device)  # noqa: E731
        self.self_attn, self.self_attn_norm = attention("self_attn"), norm("self_attn_norm")
        self.cross_attn, self.cross_attn_norm = (None, None) if config.decoder_only else \
            (attention("cross_attn"), norm("cross_attn_norm"))
        self.ffn = FeedForward(config, params, f"{name}.ffn", device, native_bf16=native_bf16)
        self.ffn_norm = norm("ffn_norm")
        self.norm_first, self.rate = config.norm_first, config.dropout

    def forward(self, y: Tensor, self_kv: tuple[Tensor, Tensor], self_mask: Tensor,
                memory_kv: tuple[Tensor, Tensor] | None, memory_mask: Tensor | None, start: int,
                rng: torch.Generator | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """n new positions y (B, n, D) at start.. -> (y (B, n, D), self_kv).

        self_kv: this layer's self-attention buffer k (B, H, P, K), v (B, H, P, C); the new positions' keys and
        values are written into it in place at ``start`` and the t = start + n written ones attended over, with
        self_mask (B, 1, n, t). memory_kv: the cross-attention keys/values of the encoder output (B, H, S, K|C),
        memory_mask (B, 1, 1, S); both None in a decoder-only model.
        """
        h = self.self_attn_norm(y) if self.norm_first else y
        k, v = self.self_attn.project_kv(h)                                     # (B, H, n, K), (B, H, n, C)
        end = start + k.shape[2]
        self_kv[0][:, :, start:end], self_kv[1][:, :, start:end] = k, v
        h = self.self_attn(h, (self_kv[0][:, :, :end], self_kv[1][:, :, :end]), self_mask)
        y = y + dropout(h, "self_attn", self.rate, rng)
        y = record("self_attn.residual", y if self.norm_first else self.self_attn_norm(y))
        if self.cross_attn is not None:
            h = self.cross_attn(self.cross_attn_norm(y) if self.norm_first else y, memory_kv, memory_mask)
            y = y + dropout(h, "cross_attn", self.rate, rng)
            y = record("cross_attn.residual", y if self.norm_first else self.cross_attn_norm(y))
        h = self.ffn(self.ffn_norm(y) if self.norm_first else y)
        y = y + dropout(h, "ffn", self.rate, rng)
        return record("ffn.residual", y if self.norm_first else self.ffn_norm(y)), self_kv


class Stack(nn.Module):
    """``n`` layers of one kind, then (pre-LN only) a final LayerNorm (section 3.1): what the encoder and decoder
    stacks share."""

    def __init__(self, config: Config, params: dict[str, np.ndarray], layer: type[nn.Module], name: str, n: int,
                 device: torch.device | str | None = None, *, native_bf16: bool = False):
        super().__init__()
        self.layers = nn.ModuleList(layer(config, params, f"{name}.layers.{i}", device, native_bf16=native_bf16)
                                    for i in range(n))
        self.final_norm = LayerNorm(config, params, f"{name}.final_norm", device) if config.norm_first else None


class Encoder(Stack):
    """N encoder layers, then (pre-LN only) a final LayerNorm: (B, S, D) -> (B, S, D)."""

    def __init__(self, config: Config, params: dict[str, np.ndarray], device: torch.device | str | None = None, *,
                 native_bf16: bool = False):
        super().__init__(config, params, EncoderLayer, "encoder", config.n_encoder_layers, device,
                         native_bf16=native_bf16)

    def forward(self, x: Tensor, mask: Tensor, rng: torch.Generator | None = None) -> Tensor:
        """x (B, S, D), mask (B, 1, 1, S) key padding mask."""
        for i, layer in enumerate(self.layers):
            with scope(f"encoder.layers.{i}"):
                x = record("out", layer(x, mask, rng))
        return x if self.final_norm is None else self.final_norm(x)


class Decoder(Stack):
    """N decoder layers, then (pre-LN only) a final LayerNorm: (B, n, D) -> (B, n, D)."""

    def __init__(self, config: Config, params: dict[str, np.ndarray], device: torch.device | str | None = None, *,
                 native_bf16: bool = False):
        super().__init__(config, params, DecoderLayer, "decoder", config.n_decoder_layers, device,
                         native_bf16=native_bf16)

    def forward(self, y: Tensor, cache: KVCache, rng: torch.Generator | None = None) -> tuple[Tensor, KVCache]:
        """n new positions y (B, n, D) at ``cache.length``.. -> (h (B, n, D), cache), the new positions' keys and
        values written into ``cache`` and ``cache.length`` advanced. ``cache.key_mask`` must already hold the new
        positions' (``decoder_logits``)."""
        start, n = cache.length, y.shape[1]
        t = start + n                                                                        # keys so far
        self_mask = causal_mask(start, n, t, y.device) & cache.key_mask[:, None, None, :t]  # (B, 1, n, t)
        memory_mask = None if cache.memory_mask is None else cache.memory_mask[:, None, None, :]  # (B, 1, 1, S)
        for i, layer in enumerate(self.layers):
            with scope(f"decoder.layers.{i}"):
                memory_kv = cache.memory_kv[i] if cache.memory_kv else None                      # decoder-only: none
                y, cache.self_kv[i] = layer(y, cache.self_kv[i], self_mask, memory_kv, memory_mask, start, rng)
                record("out", y)
        cache.length = start + n
        return y if self.final_norm is None else self.final_norm(y), cache


def encoder_memory(model: Transformer, src: Tensor, rng: torch.Generator | None = None) -> Tensor:
    """The encoder side (sections 3.1, 3.4, 3.5): src (B, S) int64 -> memory (B, S, D) in ``config.dtype``; dropout
    from ``rng`` (None: evaluation)."""
    mask = key_padding_mask(src, model.config.pad_id)[:, None, None, :]               # (B, 1, 1, S)
    x = dropout(model.embedder.encode(src), "src_embed", model.config.dropout, rng)
    return record("encoder.out", model.encoder(x, mask, rng))


def empty_cache(model: TransformerBase, batch: int, capacity: int, dtype: torch.dtype, device: torch.device
                ) -> KVCache:
    """A cache of ``capacity`` positions for ``batch`` sequences, nothing written, without cross-attention state
    (a decoder-only model's, ``LanguageModel.init_cache``'s): self-attention buffers (B, H, P, K|C) of ``dtype`` on
    ``device``, key_mask (B, P) all False."""
    c = model.config
    empty = lambda d: torch.empty(batch, c.n_heads, capacity, d, dtype=dtype, device=device)  # noqa: E731
    return KVCache(self_kv=[(empty(c.d_k), empty(c.d_v)) for _ in model.decoder.layers], memory_kv=[], memory_mask=None,
                   key_mask=torch.zeros(batch, capacity, dtype=torch.bool, device=device))


def source_cache(model: Transformer, memory: Tensor, src: Tensor, capacity: int) -> KVCache:
    """The empty cache of ``Transformer.init_cache`` for memory (B, S, D) of src (B, S) int64: ``empty_cache`` in the
    memory's dtype, with every layer's cross-attention keys/values computed once and src's key padding mask."""
    cache = empty_cache(model, memory.shape[0], capacity, memory.dtype, memory.device)
    cache.memory_kv = [tuple(t.contiguous() for t in layer.cross_attn.project_kv(memory))
                       for layer in model.decoder.layers]
    cache.memory_mask = key_padding_mask(src, model.config.pad_id)
    return cache


def decoder_logits(model: TransformerBase, tokens: Tensor, cache: KVCache, rng: torch.Generator | None = None, *,
                   at: int | None = None) -> Tensor:
    """tokens (B, n) int64 at ``cache.length``.. -> logits (B, n, V) float32, or (B, 1, V) of new position ``at``
    alone (a prefill that needs its last: the output projection of the others is most of its cost at a large V);
    ``cache`` written in place."""
    start, n = cache.length, tokens.shape[1]
    cache.key_mask[:, start:start + n] = key_padding_mask(tokens, model.config.pad_id)
    y = dropout(model.embedder.encode(tokens, start), "tgt_embed", model.config.dropout, rng)
    y, cache = model.decoder(y, cache, rng)
    y = y if at is None else y[:, at:at + 1]
    return record("logits", model.embedder.decode(record("decoder.out", y)))
