"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) in TensorFlow 2, conforming to the aiayn spec.

The common public API of ``spec.api``; the same lines work in every backend::

    import spec
    import impl_tf as T

    config = spec.preset("tiny")
    model = T.Transformer(config, seed=0)       # the weights of spec.init_params(config, 0), in every backend
    src, tgt_in = [[5, 9, 17, 2]], [[1, 7, 7]]  # (B, S), (B, T) token ids; 0 pad, 1 BOS, 2 EOS
    logits = model(src, tgt_in)                 # (B, T, V) float32, teacher forcing
    tokens = T.beam_search(model, src)          # (B, L) int64: beam 4, alpha 0.6, EOS included
    cache = model.init_cache(model.encode(src), src, capacity=8)
    step_logits, cache = model.decode([[1]], cache)   # (B, 1, V) float32; go on with the returned cache
    T.save_weights(model, "model.safetensors")
    lm = T.LanguageModel(spec.preset("lm_tiny"))      # decoder-only: lm(tokens), T.generate(lm, prompt, 8, top_p=0.9)

The TensorFlow idioms: ``Transformer`` and ``LanguageModel`` are ``tf.Module``s whose variables carry the
canonical parameter names; results are ``tf.Tensor`` (searches and ``generate``: int64); ``decode`` returns a new
``KVCache`` (a NamedTuple of tensors). Numerics follow ``spec.numerics``: bf16 parameters and activations with
fp32 accumulation exactly where the spec rounds, float32 logits. The forward, encoder, decoding step, search and
``generate`` loops run as ``tf.function(jit_compile=True)``: traced once, compiled by XLA once per concrete shape.
So that varying shapes compile a bounded number of programs, ``model(...)``, ``encode``, the searches and
``generate`` pad the batch and lengths to buckets (powers of two) and slice the results back; each compilation logs
one line at INFO on the ``"impl_tf"`` logger. The forward drops out (section 5.4) only when given a stateless seed,
``model(src, tgt_in, rng=[seed, 0])`` ((2,) int); decoding, search and ``generate`` never do.

Training (section 5, ``impl_tf.train``, ``impl_tf.train_state``): ``init_train_state`` gives a ``TrainState`` (a
dataclass: the step, the ``TrainConfig``, Adam's fp32 moment variables and a ``tf.random.Generator`` for dropout);
``train_step`` runs one compiled step (dropout, ``tf.GradientTape`` gradients, Adam) and updates model and state in
place; ``loss_and_gradients`` evaluates the loss and the fp32 gradients (``lm_train_step``,
``lm_loss_and_gradients``: next-token prediction); ``save_train_state`` and ``load_train_state`` write and read the
canonical train-state file. The library sets no process-wide TensorFlow flag and never reads or seeds TensorFlow's
global RNG.

Every entry point checks its inputs with ``spec.validate`` on a host copy before any computation and raises
the spec's ``ValueError``. Search never generates pad or BOS.
"""

try:  # the package leaves the TensorFlow build to the user (pyproject.toml): say which to install
    import tensorflow  # noqa: F401
except ModuleNotFoundError as e:
    raise ModuleNotFoundError("impl_tf needs TensorFlow >= 2.17 and leaves the build to you: pip install "
                              "'aiayn-tf[cpu]', 'aiayn-tf[gpu]' (NVIDIA, tensorflow[and-cuda]) or "
                              "'aiayn-tf[tensorflow]'") from e

from impl_tf import inputs, layers, lm, model, numerics, sampling, search, train, weights  # noqa: E402
from impl_tf.lm import LanguageModel  # noqa: E402
from impl_tf.model import Transformer  # noqa: E402
from impl_tf.numerics import numerics_scope  # noqa: E402
from impl_tf.sampling import generate  # noqa: E402
from impl_tf.search import beam_search, greedy_search  # noqa: E402
from impl_tf.stacks import KVCache  # noqa: E402
from impl_tf.train import lm_loss_and_gradients, lm_train_step, loss_and_gradients, train_step  # noqa: E402
from impl_tf.train_state import TrainState, init_train_state, load_train_state, save_train_state  # noqa: E402
from impl_tf.weights import from_params, load_weights, params_of, save_weights  # noqa: E402

__version__ = "0.2.0"

__all__ = [
    "KVCache", "LanguageModel", "TrainState", "Transformer", "__version__", "beam_search", "from_params", "generate",
    "greedy_search", "init_train_state", "inputs", "layers", "lm", "lm_loss_and_gradients", "lm_train_step",
    "load_train_state", "load_weights", "loss_and_gradients", "model", "numerics", "numerics_scope", "params_of",
    "sampling", "save_train_state", "save_weights", "search", "train", "train_step", "weights",
]
