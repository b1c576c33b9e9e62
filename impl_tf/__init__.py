"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) in TensorFlow 2, conforming to ``spec``.

bf16 parameters and activations with fp32 accumulation, exactly where ``spec.numerics`` rounds; XLA-compiled
forward, KV-cached decoding, greedy and beam search; the canonical safetensors weights format.

Example::

    import spec
    import impl_tf

    config = spec.preset("tiny")
    model = impl_tf.Transformer(config, spec.init_params(config, seed=0))   # or impl_tf.load_weights(path)
    src = [[5, 9, 17, 2]]                                                   # (B, S) token ids
    logits = model.forward(src, [[1, 7, 7]])                                # (B, T, V) float32
    tokens = impl_tf.beam_search(model, src, beam_size=4, alpha=0.6)        # (B, L) int64, EOS included
    impl_tf.save_weights(model, "model.safetensors")

Every entry point checks its inputs with ``spec.validate`` on a host copy before any computation and raises
the spec's ``ValueError``.
"""

from impl_tf.generate import beam_search, greedy_search
from impl_tf.layers import (
    DecoderLayer,
    Embedding,
    EncoderLayer,
    FeedForward,
    LayerNorm,
    MultiHeadAttention,
    SublayerConnection,
    positional_encoding,
    residual_add,
    scaled_dot_product_attention,
)
from impl_tf.model import Decoder, Encoder, KVCache, Transformer
from impl_tf.weights import load_weights, save_weights

__all__ = [
    "Decoder", "DecoderLayer", "Embedding", "Encoder", "EncoderLayer", "FeedForward", "KVCache", "LayerNorm",
    "MultiHeadAttention", "SublayerConnection", "Transformer", "beam_search", "greedy_search", "load_weights",
    "positional_encoding", "residual_add", "save_weights", "scaled_dot_product_attention",
]
