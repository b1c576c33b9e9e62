"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) in PyTorch, conforming to the aiayn spec.

Paper-exact by default (post-LN, ReLU, sinusoidal positions, one embedding shared by source, target and output
projection; the options of ``spec.config`` give published checkpoints' layers: activation, attention and logits
biases, positions, embedding scale) and bf16 by the contract of ``spec.numerics``: bf16 parameters and activations,
fp32 accumulation, fp32 attention scores and softmax, float32 logits. CPU and CUDA; float32 on request
(``config.dtype``). Parameters stored in another dtype (``config.param_dtype``) are cast to ``config.dtype`` where
they are read (rule 0). The public API is the common one of ``spec.api``::

    import spec
    import impl_torch as T

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

The PyTorch idioms: ``Transformer`` and the decoder-only ``LanguageModel`` are ``nn.Module``s; ``device=`` (keyword)
places a model built by either class, ``from_params`` or ``load_weights`` (these two return it in evaluation mode);
``native_bf16=`` (keyword, default False) runs CPU bf16 products as native bf16 GEMMs (``impl_torch.numerics``);
``decode`` writes the cache's buffers in place and returns a new cache over them (the one passed in is refused after).
Dropout draws only from a ``torch.Generator`` passed explicitly (``forward``'s ``rng``; the train state's in
``train_step``), never from torch's global RNG, so a forward without one is evaluation whatever the module's mode. On
CUDA, compute inside ``with impl_torch.numerics_scope(): ...``, which turns off TF32 and bf16 partial reductions,
process-wide flags the library never sets by itself.

Training (section 5, ``spec.training``): ``state = init_train_state(model, train_config=None, seed=0)``;
``loss, model, state = train_step(model, state, src, tgt_in, tgt_out)`` updates both in place and returns them;
``loss_and_gradients(model, src, tgt_in, tgt_out, label_smoothing=0.1)`` gives the loss and fp32 gradients
without dropout; ``save_train_state(state, path)``, ``load_train_state(path, model)``. For a ``LanguageModel``,
``lm_train_step(model, state, tokens)`` and ``lm_loss_and_gradients(model, tokens, label_smoothing=0.0)`` on
next-token prediction; ``generate`` samples with the uniforms of ``spec.sampling``, never torch's RNG.

Bad token ids and arguments raise the spec's ``ValueError`` (``spec.validate``) before anything is computed;
NumPy integer and float scalars count as Python ones. Search never generates pad or BOS.
"""

from impl_torch import inputs, layers, lm, model, numerics, sampling, search, train, weights
from impl_torch.layers import to_array, to_tensor
from impl_torch.lm import LanguageModel
from impl_torch.model import Transformer
from impl_torch.numerics import numerics_scope
from impl_torch.sampling import generate
from impl_torch.search import beam_search, greedy_search
from impl_torch.stacks import KVCache
from impl_torch.train import lm_loss_and_gradients, lm_train_step, loss_and_gradients, train_step
from impl_torch.train_state import TrainState, init_train_state, load_train_state, save_train_state
from impl_torch.weights import from_params, load_weights, params_of, save_weights

__version__ = "0.2.0"

__all__ = [
    "KVCache", "LanguageModel", "TrainState", "Transformer", "__version__", "beam_search", "from_params", "generate",
    "greedy_search", "init_train_state", "inputs", "layers", "lm", "lm_loss_and_gradients", "lm_train_step",
    "load_train_state", "load_weights", "loss_and_gradients", "model", "numerics", "numerics_scope", "params_of",
    "sampling", "save_train_state", "save_weights", "search", "to_array", "to_tensor", "train", "train_step",
    "weights",
]
