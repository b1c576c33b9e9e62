"""A template adapter: the conformance suite's protocol (``conformance.adapters.base``) over a model written
elsewhere, here the spec's own NumPy reference (``spec.reference``), for the part of the contract it declares:
teacher-forced forward of an encoder-decoder in fp32 or bf16 (docs/certify.md).

    pytest --pyargs conformance --backend conformance.examples.template_adapter

To certify your model, copy this file, build your model from the canonical weights in ``TemplateModel`` and call
it in ``forward``; then name in ``supports`` what else you implement (``CAPABILITIES``) and add those methods.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from conformance.adapters.base import NotSupported
from spec import reference as ref
from spec.config import Config
from spec.numerics import Numerics
from spec.weights_io import load_weights


class TemplateModel:
    """A model from a canonical weights file (``spec.schema`` names its tensors)."""

    def __init__(self, config: Config, params: dict[str, np.ndarray]):
        if config.norm_first:  # what the wrapped model cannot express: the checks of such configs are not supported
            raise NotSupported("pre-LN layers (norm_first)")
        self.config = config
        self._params = ref.as_float64(params, config)
        self._numerics = Numerics(config.dtype)  # the contract's roundings in the config's activation dtype

    def forward(self, src: np.ndarray, tgt_in: np.ndarray, intermediates: bool = False,
                dropout_seed: int | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """src (B, S), tgt_in (B, T) int -> logits (B, T, V) float32, and no intermediates: the suite asks for them
        (or for dropout) only of a backend that supports "intermediates" (or "dropout")."""
        logits = ref.forward(self._params, np.asarray(src), np.asarray(tgt_in), self.config, self._numerics)
        return logits.astype(np.float32), {}


class TemplateBackend:
    name = "template"
    supports = frozenset({"encoder_decoder", "float32", "bfloat16", "forward"})

    def load(self, path: Path) -> TemplateModel:
        return TemplateModel(*load_weights(path))

    def describe(self) -> str:
        return f"spec.reference through the template adapter, NumPy {np.__version__}"


def make_backend() -> TemplateBackend:
    return TemplateBackend()
