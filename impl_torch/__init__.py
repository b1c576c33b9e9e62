"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) in PyTorch, conforming to the aiayn spec.

Paper-exact (post-LN, sinusoidal positions, one embedding shared by source, target and output projection) and
bf16 by the contract of ``spec.numerics``: bf16 parameters and activations, fp32 accumulation, fp32 attention
scores and softmax, float32 logits. CPU and CUDA; float32 on request (``config.dtype``). Parameters stored in
another dtype (``config.param_dtype``) are cast to ``config.dtype`` where they are read (rule 0).

Usage::

    import torch
    from spec import preset
    import impl_torch

    model = impl_torch.load_weights("base.safetensors", device="cuda")   # canonical safetensors, eval mode
    # or: model = impl_torch.Transformer(preset("base")).eval()          # paper initialisation
    src = torch.tensor([[17, 42, 99, 2]])                                 # (B, S) token ids, pad_id = 0
    tgt_in = torch.tensor([[1, 5, 7]])                                    # (B, T), starts with bos_id
    logits = model(src, tgt_in)                                           # (B, T, V) float32
    tokens = impl_torch.beam_search(model, src, beam_size=4, alpha=0.6)   # (B, L) int64, ends at EOS
    impl_torch.save_weights(model, "copy.safetensors")                    # bit-exact round trip

Bad token ids and arguments raise the spec's ``ValueError`` (``spec.validate``) before anything is computed;
NumPy integer and float scalars count as Python ones. Search never generates pad or BOS.
"""

from impl_torch.generate import beam_search, greedy_search
from impl_torch.layers import (
                               DecoderLayer,
                               Embedding,
                               EncoderLayer,
                               FeedForward,
                               LayerNorm,
                               MultiHeadAttention,
                               SublayerConnection,
                               contract_numerics,
                               positional_encoding,
                               scaled_dot_product_attention,
)
from impl_torch.model import Decoder, Encoder, KVCache, Transformer
from impl_torch.weights import from_params, load_weights, params_of, save_weights, to_array, to_tensor

__all__ = [
    "Decoder", "DecoderLayer", "Embedding", "Encoder", "EncoderLayer", "FeedForward", "KVCache", "LayerNorm",
    "MultiHeadAttention", "SublayerConnection", "Transformer", "beam_search", "contract_numerics", "from_params",
    "greedy_search", "load_weights", "params_of", "positional_encoding", "save_weights",
    "scaled_dot_product_attention", "to_array", "to_tensor",
]
