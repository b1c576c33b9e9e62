"""impl_tf as a conformance backend: the generic adapter (``conformance.adapters.impl``) in TensorFlow's dialect.

Layers alone run eagerly on the model's own ``tf.Module``s. The session runs inside ``impl_tf.numerics_scope()``
(TF32 off: fp32 products stay fp32 on GPUs, ``spec.numerics`` rule 8); op determinism on is the test harness's
process-wide choice, not the library's.
"""

from __future__ import annotations

import atexit
import contextlib
import platform
from pathlib import Path

import numpy as np
import tensorflow as tf

import impl_tf
from conformance.adapters.impl import Dialect, ImplModel
from impl_tf.layers import residual_add

tf.config.experimental.enable_op_determinism()  # repeatable runs


class TFDialect(Dialect):
    def array(self, x):
        return x.numpy()

    def tensor(self, a, model):
        return tf.constant(a.astype(np.int32) if a.dtype.kind in "iu" else a)  # ids as the model's int32

    def zeros(self, like, shape):
        return tf.zeros(shape, like.dtype)

    def heads_major(self, x):
        return tf.transpose(x, [0, 2, 1, 3])

    def add(self, x, y):
        return residual_add(x, y)

    def concat(self, xs):
        return tf.concat(xs, axis=1)

    def rng(self, seed, model):
        return tf.constant([seed, 0], tf.int64)  # a stateless seed: impl_tf's forward folds each site's from it


class TFBackend:
    name = "tf"
    module = impl_tf

    def __init__(self):
        # Entered for the life of the backend, i.e. the session, and left at exit.
        self._session = contextlib.ExitStack()
        self._session.enter_context(impl_tf.numerics_scope())
        atexit.register(self._session.close)  # restored at exit, before the interpreter tears modules down

    def load(self, path: Path) -> ImplModel:
        return ImplModel(impl_tf, impl_tf.load_weights(path), TFDialect())

    def sample(self, logits, u, temperature, top_k, top_p):
        return impl_tf.sampling.sample(tf.constant(logits), tf.constant(u, tf.float32), temperature, top_k,
                                       top_p).numpy()

    def describe(self) -> str:
        devices = ", ".join(d.device_type for d in tf.config.list_logical_devices()) or "none"
        return f"TensorFlow {tf.__version__} (XLA jit_compile), devices: {devices}, {platform.machine()}"


def make_backend() -> TFBackend:
    return TFBackend()
