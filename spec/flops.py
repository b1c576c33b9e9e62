"""FLOP counts of the model, for benchmark utilisation figures.

Counts the matrix products only (2 FLOPs per multiply-add): projections,
attention scores and ``P V``, FFN, output projection. Softmax, LayerNorm,
residuals and the embedding gather are O(B L D) and left out; at the paper's
sizes they are under 1% of the total. Attention is counted dense over the
padded lengths (masked entries cost the same on every backend measured).
"""

from __future__ import annotations

from spec.config import Config


def _attention(c: Config, B: int, n_q: int, n_kv: int) -> int:
    D, HK, HC = c.d_model, c.n_heads * c.d_k, c.n_heads * c.d_v
    proj = 2 * B * (n_q * D * HK + n_kv * D * HK + n_kv * D * HC + n_q * HC * D)
    return proj + 2 * B * n_q * n_kv * (HK + HC)  # Q K^T and P V


def _ffn(c: Config, B: int, n: int) -> int:
    return 2 * 2 * B * n * c.d_model * c.d_ff


def forward_flops(c: Config, B: int, S: int, T: int) -> int:
    """Matmul FLOPs of one teacher-forced forward: src (B, S), tgt_in (B, T) -> logits (B, T, V); of a decoder-only
    model's forward of tokens (B, T) with S=0."""
    enc = c.n_encoder_layers * (_attention(c, B, S, S) + _ffn(c, B, S))
    cross = 0 if c.decoder_only else _attention(c, B, T, S)
    dec = c.n_decoder_layers * (_attention(c, B, T, T) + cross + _ffn(c, B, T))
    return enc + dec + 2 * B * T * c.d_model * c.vocab_size


def decode_flops(c: Config, B: int, n: int, context: int) -> int:
    """Matmul FLOPs of one decoder-only ``decode`` of n new positions after ``context`` cached ones (a prefill is
    context 0): keys and values are projected for the new positions only, attention spans context + n."""
    D, HK, HC = c.d_model, c.n_heads * c.d_k, c.n_heads * c.d_v
    attn = 2 * B * n * D * (2 * HK + HC) + 2 * B * n * HC * D + 2 * B * n * (context + n) * (HK + HC)
    return c.n_decoder_layers * (attn + _ffn(c, B, n)) + 2 * B * n * D * c.vocab_size


def train_step_flops(c: Config, B: int, S: int, T: int) -> int:
    """Forward plus backward: the backward of a matmul costs two matmuls, so 3x forward."""
    return 3 * forward_flops(c, B, S, T)
