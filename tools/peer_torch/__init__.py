"""The stock peer: ``torch.nn.Transformer`` as a torch user builds and trains it, behind the subset of the common
API (``spec.api``) that the translation demo's training loop (``text.train``, ``text.translate``) calls, so the
loop drives it exactly like ``impl_torch``::

    import spec
    from tools import peer_torch as P

    config = spec.preset("mini")
    model = P.Transformer(config, seed=0)               # torch's own default initialisation, seeded
    state = P.init_train_state(model, spec.training.TrainConfig(warmup_steps=400, lr_scale=0.5), seed=0)
    loss, model, state = P.train_step(model, state, src, tgt_in, tgt_out)   # NumPy int64 (B, S), (B, T)
    tokens = P.beam_search(model, src)                  # (B, L) int64 NumPy: beam 4, alpha 0.6, EOS included

The model: ``nn.Transformer`` at the config's hyperparameters (post-LN unless ``norm_first``, ReLU,
``layer_norm_eps``, ``batch_first``, dropout ``config.dropout`` inside the stock layers), one ``nn.Embedding``
shared by source, target and the tied output projection, scaled by sqrt(d_model), plus the sinusoidal positional
encoding and dropout after the sum; a causal target mask and key padding masks for source and target pad ids.
What the stock module is, and the paper's model is not: the heads are d_model / n_heads wide (a config whose
d_k or d_v differs is refused), and ``nn.Transformer`` always puts a final LayerNorm on each stack, post-LN too.
Initialisation: ``nn.Transformer``'s Xavier-uniform on every matrix of the stack, and by default
(``init="xavier"``) on the embedding too, as PyTorch's translation tutorial does (``init="default"`` keeps
``nn.Embedding``'s N(0, 1)). Not ``spec.init_params``: the parameters have the peer's own names (the ``state_dict``
keys), which ``from_params``, ``params_of``, ``save_weights`` and ``load_weights`` speak; canonical parameters are
refused. ``save_train_state``/``load_train_state`` (the loop's checkpoints) keep Adam's moments, the step, the
config and the dropout generator, so a resumed run goes on bit for bit.

Precision: fp32 parameters whatever ``config.param_dtype``; for ``config.dtype == "bfloat16"`` every forward
(teacher-forced, training and search) runs under ``torch.autocast("cpu", torch.bfloat16)`` where the CPU has bf16
dot-product instructions (``native_bf16``: avx512_bf16 or AMX), in fp32 where it has not (autocast's bf16 products
are emulated there, many times slower: the peer keeps its best setting); logits are returned float32.
Training: ``torch.optim.Adam`` (fused kernel) with a ``LambdaLR`` schedule giving
``spec.training.learning_rate(t, d_model, warmup_steps, scale=lr_scale)`` at step t = 1, 2, ...,
``nn.CrossEntropyLoss(ignore_index=pad_id, label_smoothing=...)`` on the fp32 logits. Dropout masks come from the
train state's ``torch.Generator`` (the stock layers draw from torch's global CPU generator, so each step runs
inside ``torch.random.fork_rng`` with the global state set from the state's generator and read back after);
construction likewise seeds inside ``fork_rng``: no global RNG state is left changed.

Search (``spec.search``'s algorithms): evaluation mode and ``torch.inference_mode`` whatever the model's mode
(restored after); the encoder runs once per search, the decoder over the whole prefix at every step (the stock
module has no KV cache); rows that have finished drop out of the batch. CPU only.
"""

from tools.peer_torch.model import (
                                    FRAMEWORK,
                                    INITS,
                                    Transformer,
                                    from_params,
                                    load_weights,
                                    params_of,
                                    positional_encoding,
                                    save_weights,
)
from tools.peer_torch.search import beam_search, greedy_search
from tools.peer_torch.train import TrainState, init_train_state, load_train_state, save_train_state, train_step

__version__ = "0.1"
__all__ = ["FRAMEWORK", "INITS", "TrainState", "Transformer", "beam_search", "from_params", "greedy_search",
           "init_train_state", "load_train_state", "load_weights", "params_of", "positional_encoding",
           "save_train_state", "save_weights", "train_step"]
