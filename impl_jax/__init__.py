"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) in JAX, conforming to the aiayn spec.

Pure functions of a parameter pytree, compiled with ``jax.jit`` with the
(frozen, hashable) ``spec.config.Config`` as a static argument. Numerics follow
``spec.numerics``: bf16 parameters and activations, fp32 accumulation,
attention scores, softmax and LayerNorm statistics in fp32, float32 logits.

Example::

    import impl_jax as T
    from spec.config import TINY

    params = T.init_params(TINY, seed=0)                  # or: config, params = T.load_weights("model.safetensors")
    src = [[5, 6, 7, 2]]                                  # (B, S) token ids; 0 = pad, 1 = BOS, 2 = EOS
    logits = T.forward(params, TINY, src, [[1, 8, 9]])    # (1, 3, V) float32, teacher forcing
    tokens = T.beam_search(params, TINY, src)             # (1, L) int32: beam 4, alpha 0.6, limit S + 50
    memory = T.encode(params, TINY, src)                  # incremental decoding with a KV cache:
    cache = T.init_cache(params, TINY, memory, src, capacity=16)
    step_logits, cache = T.decode(params, TINY, [[1]], cache)
    T.save_weights(params, TINY, "model.safetensors")

Every entry point raises ``ValueError`` (the spec's messages) on bad input
before anything is traced.
"""

from impl_jax import layers
from impl_jax.generate import beam_search, greedy_search
from impl_jax.model import KVCache, decode, encode, forward, init_cache, output_logits
from impl_jax.weights import init_params, load_weights, params_at, save_weights, to_flat, to_tree

__all__ = [
    "KVCache", "beam_search", "decode", "encode", "forward", "greedy_search", "init_cache", "init_params", "layers",
    "load_weights", "output_logits", "params_at", "save_weights", "to_flat", "to_tree",
]
