"""impl_torch as a conformance backend: the generic adapter (``conformance.adapters.impl``) in torch's dialect.

NumPy crosses in both directions: token ids are passed through as given (impl_torch validates them), bf16
activations come back as ``ml_dtypes.bfloat16``, logits as float32. Runs on CUDA when available, else CPU, inside
``impl_torch.numerics_scope()`` for the whole session. ``AIAYN_TORCH_NATIVE_BF16=1`` in the environment builds the
models with ``native_bf16=True`` (CPU bf16 products as native bf16 GEMMs, ``impl_torch.numerics``); the default is
the library's default, fp32 GEMMs of the upcast operands.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import platform
from pathlib import Path

import numpy as np
import torch

import impl_torch
from conformance.adapters.impl import Dialect, ImplModel

NATIVE_BF16 = os.environ.get("AIAYN_TORCH_NATIVE_BF16", "0") == "1"


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class TorchDialect(Dialect):
    def array(self, x):
        return impl_torch.to_array(x)

    def tensor(self, a, model):
        return impl_torch.to_tensor(np.asarray(a)).to(model.embedding.device)

    def zeros(self, like, shape):
        return like.new_zeros(shape)

    def heads_major(self, x):
        return x.transpose(1, 2)

    def rng(self, seed, model):
        return torch.Generator(device=model.embedding.device).manual_seed(seed)

    def concat(self, xs):
        return torch.cat(xs, dim=1)

    def evaluating(self):
        return torch.inference_mode()

    def run(self, key, fn, *args):
        with torch.inference_mode():
            return fn(*args)

    def copy(self, impl, model):
        return impl.from_params(model.config, impl.params_of(model), device=model.embedding.device,
                                native_bf16=NATIVE_BF16)


class TorchBackend:
    name = "torch"
    module = impl_torch

    def __init__(self):
        # Entered for the life of the backend, i.e. the session, and left at exit: the stack holds the contexts (a
        # generator context that is garbage-collected would exit, restoring the flags).
        self._session = contextlib.ExitStack()
        self._session.enter_context(impl_torch.numerics_scope())  # TF32 off, fp32 reductions in bf16 GEMMs (CUDA)
        atexit.register(self._session.close)  # restored at exit, before the interpreter tears modules down
        torch.use_deterministic_algorithms(True, warn_only=True)

    def load(self, path: Path) -> ImplModel:
        return ImplModel(impl_torch, impl_torch.load_weights(path, device=_device(), native_bf16=NATIVE_BF16),
                         TorchDialect())

    def sample(self, logits, u, temperature, top_k, top_p):
        with torch.inference_mode():
            return impl_torch.to_array(impl_torch.sampling.sample(
                torch.as_tensor(logits, device=_device()), torch.as_tensor(u, dtype=torch.float32, device=_device()),
                temperature, top_k, top_p))

    def describe(self) -> str:
        dev = _device()
        where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"{platform.machine()} CPU"
        return f"PyTorch {torch.__version__}, {where}"


def make_backend() -> TorchBackend:
    return TorchBackend()
