"""The encoder and decoder stacks (Vaswani et al., 2017, section 3.1) in NumPy: the encoder and decoder layers,
the stacks of N of them and the KV cache their decoder runs on, over ``spec.reference.layers``.

Shape letters of ``spec.config``; the KV cache's layout is ``spec.api``'s, keys and values heads-major (B, H, P, K).
Intermediates are recorded through ``spec.recording`` under the names of ``spec.shapes.intermediates``. The
mutation test (``conformance.mutants``) replaces these functions and methods one at a time, so every call goes
through the module or the class.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from spec.config import Config
from spec.numerics import Numerics
from spec.recording import record, scope
from spec.reference.layers import FeedForward, LayerNorm, MultiHeadAttention, Params, Rng, dropout


@dataclasses.dataclass
class KVCache:
    """The decoder state (``spec.api``): per decoder layer the self-attention buffer ``self_kv`` (k (B, H, P, K),
    v (B, H, P, C)) written at positions < ``length``, ``key_mask`` (B, P) True at a written non-pad position,
    the encoder output's cross-attention ``memory_kv`` (k (B, H, S, K), v (B, H, S, C)) and ``memory_mask``
    (B, S); a decoder-only model's has ``memory_kv`` [] and ``memory_mask`` None. ``decode`` writes it in place and
    returns it."""

    self_kv: list[tuple[np.ndarray, np.ndarray]]
    key_mask: np.ndarray
    memory_kv: list[tuple[np.ndarray, np.ndarray]]
    memory_mask: np.ndarray
    length: int


def key_padding_mask(ids: np.ndarray, pad_id: int) -> np.ndarray:
    """(B, L) ids -> (B, L) bool, True where the token is not padding."""
    return ids != pad_id


def causal_mask(start: int, n: int, length: int) -> np.ndarray:
    """(1, n, length) bool: the query at position start + i may attend key j <= start + i."""
    q_pos = np.arange(start, start + n)[:, None]
    return (np.arange(length)[None, :] <= q_pos)[None]


class EncoderLayer:
    """Self-attention then FFN, each with a residual connection and LayerNorm (sections 3.1, 5.4): (B, S, D) ->
    (B, S, D). Post-LN (the paper): ``norm(x + sublayer(x))``; pre-LN (``config.norm_first``):
    ``x + sublayer(norm(x))``. Records each sublayer's output as ``<name>`` and the residual line's as
    ``<name>.residual``, relative to the layer (the stack scopes)."""

    def __init__(self, params: Params, prefix: str, c: Config, nx: Numerics):
        self.self_attn = MultiHeadAttention(params, f"{prefix}.self_attn", nx)
        self.self_attn_norm = LayerNorm(params, f"{prefix}.self_attn_norm", c.layer_norm_eps, nx)
        self.ffn = FeedForward(params, f"{prefix}.ffn", c.activation, nx)
        self.ffn_norm = LayerNorm(params, f"{prefix}.ffn_norm", c.layer_norm_eps, nx)
        self.norm_first, self.rate, self.nx = c.norm_first, c.dropout, nx

    def forward(self, x: np.ndarray, mask: np.ndarray, rng: Rng = None) -> np.ndarray:
        """x (B, S, D), mask (B, 1, S) key padding mask; dropout from ``rng``."""
        h = self.self_attn_norm.forward(x) if self.norm_first else x
        h = self.self_attn.forward(h, self.self_attn.project_kv(h), mask)
        x = self.nx.act(x + dropout(h, "self_attn", self.rate, rng, self.nx))
        x = record("self_attn.residual", x if self.norm_first else self.self_attn_norm.forward(x))
        h = self.ffn.forward(self.ffn_norm.forward(x) if self.norm_first else x)
        x = self.nx.act(x + dropout(h, "ffn", self.rate, rng, self.nx))
        return record("ffn.residual", x if self.norm_first else self.ffn_norm.forward(x))


class DecoderLayer:
    """Masked self-attention, cross-attention over the encoder output, FFN (section 3.1), each with its residual
    line as ``EncoderLayer``'s: (B, n, D) -> (B, n, D). A decoder-only model's layer (``config.decoder_only``) has
    no cross-attention (``cross_attn`` None)."""

    def __init__(self, params: Params, prefix: str, c: Config, nx: Numerics):
        self.self_attn = MultiHeadAttention(params, f"{prefix}.self_attn", nx)
        self.self_attn_norm = LayerNorm(params, f"{prefix}.self_attn_norm", c.layer_norm_eps, nx)
        self.cross_attn = None if c.decoder_only else MultiHeadAttention(params, f"{prefix}.cross_attn", nx)
        self.cross_attn_norm = None if c.decoder_only else LayerNorm(params, f"{prefix}.cross_attn_norm",
                                                                       c.layer_norm_eps, nx)
        self.ffn = FeedForward(params, f"{prefix}.ffn", c.activation, nx)
        self.ffn_norm = LayerNorm(params, f"{prefix}.ffn_norm", c.layer_norm_eps, nx)
        self.norm_first, self.rate, self.nx = c.norm_first, c.dropout, nx

    def forward(self, y: np.ndarray, self_kv: tuple[np.ndarray, np.ndarray], self_mask: np.ndarray,
                memory_kv: tuple[np.ndarray, np.ndarray], memory_mask: np.ndarray, start: int, rng: Rng = None
                ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """n new positions y (B, n, D) at start.. -> (y (B, n, D), self_kv).

        self_kv: this layer's self-attention buffer k (B, H, P, K), v (B, H, P, C); the new positions' keys and
        values are written into it at ``start`` and the t = start + n written ones attended over, with
        self_mask (B, n, t). memory_kv: the cross-attention keys/values of the encoder output (B, H, S, K|C),
        memory_mask (B, 1, S); both None in a decoder-only model. Dropout from ``rng``.
        """
        h = self.self_attn_norm.forward(y) if self.norm_first else y
        k, v = self.self_attn.project_kv(h)                                     # (B, H, n, K), (B, H, n, C)
        end = start + k.shape[2]
        self_kv[0][:, :, start:end], self_kv[1][:, :, start:end] = k, v
        h = self.self_attn.forward(h, (self_kv[0][:, :, :end], self_kv[1][:, :, :end]), self_mask)
        y = self.nx.act(y + dropout(h, "self_attn", self.rate, rng, self.nx))
        y = record("self_attn.residual", y if self.norm_first else self.self_attn_norm.forward(y))
        if self.cross_attn is not None:
            h = self.cross_attn_norm.forward(y) if self.norm_first else y
            h = self.cross_attn.forward(h, memory_kv, memory_mask)
            y = self.nx.act(y + dropout(h, "cross_attn", self.rate, rng, self.nx))
            y = record("cross_attn.residual", y if self.norm_first else self.cross_attn_norm.forward(y))
        h = self.ffn.forward(self.ffn_norm.forward(y) if self.norm_first else y)
        y = self.nx.act(y + dropout(h, "ffn", self.rate, rng, self.nx))
        return record("ffn.residual", y if self.norm_first else self.ffn_norm.forward(y)), self_kv


class Stack:
    """``n`` layers of one kind under the canonical prefix ``name``, and the final LayerNorm of a pre-LN model
    (section 3.1): what the encoder and decoder stacks share."""

    def __init__(self, params: Params, c: Config, nx: Numerics, layer: type, name: str, n: int):
        self.layers = [layer(params, f"{name}.layers.{i}", c, nx) for i in range(n)]
        self.final_norm = LayerNorm(params, f"{name}.final_norm", c.layer_norm_eps, nx) if c.norm_first else None


class Encoder(Stack):
    """The encoder stack (section 3.1), and the final LayerNorm of a pre-LN model."""

    def __init__(self, params: Params, c: Config, nx: Numerics):
        super().__init__(params, c, nx, EncoderLayer, "encoder", c.n_encoder_layers)

    def forward(self, x: np.ndarray, mask: np.ndarray, rng: Rng = None) -> np.ndarray:
        """x (B, S, D), mask (B, 1, S) -> memory (B, S, D); dropout from ``rng``."""
        for i, layer in enumerate(self.layers):
            with scope(f"encoder.layers.{i}"):
                x = record("out", layer.forward(x, mask, rng))
        return x if self.final_norm is None else self.final_norm.forward(x)


class Decoder(Stack):
    """The decoder stack (section 3.1), and the final LayerNorm of a pre-LN model."""

    def __init__(self, params: Params, c: Config, nx: Numerics):
        super().__init__(params, c, nx, DecoderLayer, "decoder", c.n_decoder_layers)

    def forward(self, y: np.ndarray, cache: KVCache, rng: Rng = None) -> tuple[np.ndarray, KVCache]:
        """n new positions y (B, n, D) at ``cache.length``.. (their ``key_mask`` written) -> (h (B, n, D), cache);
        dropout from ``rng``.

        Self-attention sees every earlier position and the new ones causally, minus padding keys.
        """
        start, end = cache.length, cache.length + y.shape[1]
        self_mask = causal_mask(start, y.shape[1], end) & cache.key_mask[:, None, :end]      # (B, n, end)
        memory_mask = None if cache.memory_mask is None else cache.memory_mask[:, None]      # (B, 1, S)
        for i, layer in enumerate(self.layers):
            with scope(f"decoder.layers.{i}"):
                memory_kv = cache.memory_kv[i] if cache.memory_kv else None                  # decoder-only: none
                y, cache.self_kv[i] = layer.forward(y, cache.self_kv[i], self_mask, memory_kv, memory_mask, start,
                                                    rng)
                record("out", y)
        cache.length = end
        return (y if self.final_norm is None else self.final_norm.forward(y)), cache
