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

The contract in three files: ``protocols`` (the model types and the KV cache), ``functions`` (the module-level
functions, as reference signatures) and ``check`` (``check_api``: how an impl module departs from them).
"""

from spec.api.check import FUNCTIONS, METHODS, NAMES, check_api, compare_signature
from spec.api.functions import (
    LanguageModel,
    Transformer,
    beam_search,
    from_params,
    generate,
    greedy_search,
    init_train_state,
    lm_loss_and_gradients,
    lm_train_step,
    load_train_state,
    load_weights,
    loss_and_gradients,
    params_of,
    save_train_state,
    save_weights,
    train_step,
)
from spec.api.protocols import KV_CACHE_FIELDS, DecoderOnlyModel, KVCache, Model

# The impls that export this API, each the package impl_<name>: every tool, bench and report lists them from here.
BACKENDS = ("torch", "jax", "tf")

__all__ = [
    "BACKENDS", "KV_CACHE_FIELDS", "KVCache", "Model", "DecoderOnlyModel", "Transformer", "LanguageModel",
    "load_weights", "save_weights", "from_params", "params_of", "greedy_search", "beam_search", "generate",
    "init_train_state", "loss_and_gradients", "train_step", "lm_loss_and_gradients", "lm_train_step",
    "save_train_state", "load_train_state", "FUNCTIONS", "METHODS", "NAMES", "check_api", "compare_signature"]
