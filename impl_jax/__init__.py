"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) in JAX, conforming to the aiayn spec.

The common public API of ``spec.api``; the same lines work in every backend::

    import spec
    import impl_jax as T

    config = spec.preset("tiny")
    model = T.Transformer(config, seed=0)       # the weights of spec.init_params(config, 0), in every backend
    src, tgt_in = [[5, 9, 17, 2]], [[1, 7, 7]]  # (B, S), (B, T) token ids; 0 pad, 1 BOS, 2 EOS
    logits = model(src, tgt_in)                 # (B, T, V) float32, teacher forcing
    tokens = T.beam_search(model, src)          # (B, L) int64: beam 4, alpha 0.6, EOS included
    cache = model.init_cache(model.encode(src), src, capacity=8)
    step_logits, cache = model.decode([[1]], cache)   # (B, 1, V) float32; go on with the returned cache
    T.save_weights(model, "model.safetensors")
    state = T.init_train_state(model)           # Adam's fp32 moments, step 0, the dropout PRNG key (section 5)
    loss, model, state = T.train_step(model, state, src, tgt_in, [[7, 7, 2]])   # new model and state
    new = T.generate(T.LanguageModel(spec.preset("lm_tiny")), [[1, 7, 9]], max_new_tokens=8, top_p=0.9)  # NumPy

``Transformer`` (as the decoder-only ``LanguageModel``) is a pytree of modules (``impl_jax.layers.Module``:
parameters as children, the frozen config as static aux data), so ``jax.jit(lambda m, s, t: m(s, t),
compiler_options=impl_jax.XLA_OPTIONS)`` works (the options keep XLA from skipping the contract's bf16 roundings; JAX
takes them from the outermost jit only), and so do ``jax.tree.map`` and ``jax.grad`` over it; its layers
(``impl_jax.layers``) are modules of their own. Numerics
follow ``spec.numerics`` (``impl_jax.numerics``): bf16 parameters and activations, fp32 accumulation, attention
scores, softmax and LayerNorm statistics in fp32, float32 logits. Search results are NumPy int64 arrays (JAX has
int64 only under the process-wide ``jax_enable_x64`` flag, which this library never sets), and so are
``generate``'s.

Batch and lengths are padded to buckets inside ``model(...)``, ``encode``, the searches and ``generate``, and in
training (``impl_jax.train``), so varying shapes compile a bounded number of programs; each compilation logs one line
at INFO on the ``"impl_jax"`` logger.

Every entry point raises ``ValueError`` (the spec's messages, ``spec.validate``)
on bad input before anything is computed.
"""

from impl_jax import inputs, layers, lm, model, numerics, sampling, search, train, weights
from impl_jax.lm import LanguageModel
from impl_jax.model import Transformer
from impl_jax.numerics import XLA_OPTIONS
from impl_jax.sampling import generate
from impl_jax.search import beam_search, greedy_search
from impl_jax.stacks import KVCache
from impl_jax.train import lm_loss_and_gradients, lm_train_step, loss_and_gradients, train_step
from impl_jax.train_state import TrainState, init_train_state, load_train_state, save_train_state
from impl_jax.weights import from_params, load_weights, params_of, save_weights

__version__ = "0.2.0"

__all__ = [
    "KVCache", "LanguageModel", "TrainState", "Transformer", "XLA_OPTIONS", "__version__", "beam_search",
    "from_params", "generate", "greedy_search", "init_train_state", "inputs", "layers", "lm", "lm_loss_and_gradients",
    "lm_train_step", "load_train_state", "load_weights", "loss_and_gradients", "model", "numerics", "params_of",
    "sampling", "save_train_state", "save_weights", "search", "train", "train_step", "weights",
]
