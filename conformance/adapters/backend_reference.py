"""The NumPy reference as a backend, in its contract-faithful mode (the config's dtype).

Its model is a ``spec.reference.Transformer``, whose layers call the reference's functions and methods at call
time, and it calls ``spec.search`` through the module, so the suite's mutants (``conformance.mutants``) reach it.
"""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np

from spec import backward, golden_training, sampling, search, validate
from spec import reference as ref
from spec.config import Config
from spec.numerics import Numerics
from spec.weights_io import load_weights, save_weights


def _float_inputs(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v if v.dtype.kind in "bi" else v.astype(np.float64) for k, v in inputs.items()}


class ReferenceModel:
    def __init__(self, config: Config, params: dict[str, np.ndarray]):
        self.config = config
        self._params = params
        self._p = ref.as_float64(params, config)
        self._nx = Numerics(config.dtype)
        self._model = (ref.LanguageModel if config.decoder_only else ref.Transformer)(self._p, config, self._nx)

    def _out(self, x: np.ndarray) -> np.ndarray:
        return x.astype(self._nx.act_dtype)

    def forward(self, src, tgt_in, intermediates=False, dropout_seed=None):
        rng = None if dropout_seed is None else np.random.default_rng(dropout_seed)
        ids = (validate.host_ids("tokens", tgt_in),) if self.config.decoder_only else (
            validate.host_ids("src", src), validate.host_ids("tgt_in", tgt_in))
        out = self._model.forward(*ids, intermediates, rng=rng)
        logits, rec = out if intermediates else (out, {})
        inter = {k: v if v.dtype == bool else v.astype(np.float32) if k == "logits" else self._out(v)
                 for k, v in rec.items()}
        return logits.astype(np.float32), inter

    def encode(self, src):
        src = validate.host_ids("src", src)
        validate.check_source(src, self.config)
        return self._out(self._model.encode(src))

    def decode_steps(self, src, tgt_in, chunks=None, capacity=None):
        tgt_in = validate.host_ids("tgt_in", tgt_in)
        capacity = tgt_in.shape[1] if capacity is None else capacity
        if self.config.decoder_only:
            validate.check_tokens("tokens", tgt_in, self.config)
            cache = self._model.init_cache(tgt_in.shape[0], capacity)
        else:
            src = validate.host_ids("src", src)
            validate.check_forward(src, tgt_in, self.config)
            validate.check_capacity(capacity, self.config)
            cache = self._model.init_cache(self._model.encode(src), src, capacity)
        steps, start = [], 0
        for n in chunks if chunks is not None else [1] * tgt_in.shape[1]:
            tokens = tgt_in[:, start:start + n]
            validate.check_decode(tokens, self.config, cache.key_mask.shape[0], cache.length, capacity)
            logits, cache = self._model.decode(tokens, cache)
            steps.append(logits)
            start += n
        return np.concatenate(steps, axis=1).astype(np.float32)

    def greedy(self, src, max_new_tokens=None):
        return search.greedy_search(self._p, validate.host_ids("src", src), self.config, self._nx, max_new_tokens)

    def beam(self, src, beam_size=4, alpha=0.6, max_new_tokens=None):
        return search.beam_search(self._p, validate.host_ids("src", src), self.config, self._nx, beam_size, alpha,
                                  max_new_tokens)

    def generate(self, prompt, max_new_tokens, temperature=1.0, top_k=None, top_p=1.0, seed=0):
        return sampling.generate(self._p, validate.host_ids("prompt", prompt), self.config, self._nx, max_new_tokens,
                                 temperature, top_k, top_p, seed)

    def run_layer(self, layer, prefix, inputs):
        out = ref.run_layer(layer, self._p, prefix, _float_inputs(inputs), self.config, self._nx)
        fp32 = {"pe", "logits"}
        return {k: v.astype(np.float32) if k in fp32 else self._out(v) for k, v in out.items()}

    def save(self, path: Path) -> None:
        save_weights(path, self.config, self._params)

    def train(self, batches, train_config, record_after):
        # The faithful trajectory (spec.golden_training), reached through its modules so that mutants apply.
        run = golden_training.trajectory(self._params, list(batches), self.config, train_config, self._nx)
        grads = backward.lm_loss_and_gradients if self.config.decoder_only else backward.loss_and_gradients
        grad = grads(self._params, *batches[0], self.config, train_config.label_smoothing, self._nx)[1]
        return {"loss": np.array(run["loss"]), "grad": grad,
                **{f"params_{k}": run["params"][k - 1] for k in record_after}}


class ReferenceBackend:
    name = "reference"

    def load(self, path: Path) -> ReferenceModel:
        return ReferenceModel(*load_weights(path))

    def describe(self) -> str:
        return f"NumPy {np.__version__} (contract-faithful), {platform.machine()} CPU"

    def sample(self, logits, u, temperature, top_k, top_p):
        return sampling.sample(logits, u, temperature, top_k, top_p, Numerics("float32"))


def make_backend() -> ReferenceBackend:
    return ReferenceBackend()
