"""impl_jax as a conformance backend: the generic adapter (``conformance.adapters.impl``) in JAX's dialect.

A layer alone runs jitted, on the model's modules with their weights in the compute dtype. fp32 products are
pinned to true fp32 (``jax_default_matmul_precision``), so fp32 checks never run as TF32 or bf16 passes on an
accelerator, and GPU reductions are made deterministic (``--xla_gpu_deterministic_ops``, read when JAX starts its
backend; a no-op on CPU). Those are the test harness's process-wide choices, not the library's.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS"), "--xla_gpu_deterministic_ops=true"]))

import jax  # noqa: E402  (after XLA_FLAGS)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import impl_jax  # noqa: E402
from conformance.adapters.impl import Dialect, ImplModel  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


class JaxDialect(Dialect):
    def __init__(self):
        self._jitted = {}

    def array(self, x):
        return np.asarray(jax.device_get(x))

    def tensor(self, a, model):
        return jnp.asarray(a)

    def zeros(self, like, shape):
        return jnp.zeros(shape, like.dtype)

    def heads_major(self, x):
        return x.swapaxes(1, 2)

    def concat(self, xs):
        return jnp.concatenate(xs, axis=1)

    def rng(self, seed, model):
        return jax.random.key(seed)

    def layers_of(self, model):
        return jax.tree.map(lambda p: p.astype(model.config.dtype), model)

    def run(self, key, fn, *args):
        if key not in self._jitted:
            self._jitted[key] = impl_jax.numerics.jit(fn)  # with XLA_OPTIONS, as every impl_jax program
        return self._jitted[key](*args)

    def copy(self, impl, model):
        return model  # immutable: training returns new models


class JaxBackend:
    name = "jax"
    module = impl_jax

    def __init__(self):
        self.dialect = JaxDialect()  # one for the session, so each layer's program compiles once

    def load(self, path: Path) -> ImplModel:
        return ImplModel(impl_jax, impl_jax.load_weights(path), self.dialect)

    def sample(self, logits, u, temperature, top_k, top_p):
        return np.asarray(impl_jax.sampling.sample(jnp.asarray(logits), jnp.asarray(u, jnp.float32), temperature,
                                                   top_k, top_p))

    def describe(self) -> str:
        d = jax.devices()[0]
        return f"JAX {jax.__version__}, {d.platform.upper()} ({d.device_kind})"


def make_backend() -> JaxBackend:
    return JaxBackend()
