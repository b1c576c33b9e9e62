"""What a backend supports, enforced: the suite reaches every backend and model through these wrappers, so a check
that asks for a capability the backend lacks (``conformance.adapters.base.CAPABILITIES``) stops with
``NotSupported`` at that call, and is reported as "not supported", never as passed or failed.

The capabilities a check needs are the calls it makes (``decode_steps`` needs "cache"), the config of the model it
loads (its kind and activation dtype), and what no call shows, declared with ``@pytest.mark.needs(...)``: "errors"
(the spec's ``ValueError``). "api" is the backend's ``module``, an impl of ``spec.api``'s common API.
"""

from __future__ import annotations

from pathlib import Path

from conformance.adapters.base import CAPABILITIES, NotSupported
from spec.config import Config
from spec.weights_io import read_config

# The Model method -> the capability it needs; ``forward`` also needs "intermediates" or "dropout" when asked for them.
METHODS = {"forward": "forward", "encode": "encode", "decode_steps": "cache", "greedy": "greedy", "beam": "beam",
           "generate": "generate", "run_layer": "layers", "save": "save", "train": "train"}


def supported(backend) -> frozenset[str]:
    """The backend's ``supports``, all of ``CAPABILITIES`` for a backend that does not say; a ValueError for a name
    outside them (a misspelt capability would otherwise make its checks not supported without a word)."""
    everything = CAPABILITIES if hasattr(backend, "module") else CAPABILITIES - {"api"}  # "api": a ``module`` to ask
    given = frozenset(getattr(backend, "supports", everything))
    unknown = sorted(given - CAPABILITIES)
    if unknown:
        raise ValueError(f"backend {backend.name!r} supports unknown capabilities {unknown}; "
                         f"the capabilities are {sorted(CAPABILITIES)}")
    return given


def require(supports: frozenset[str], *needs: str) -> None:
    """Raise ``NotSupported`` naming what of ``needs`` is not in ``supports``."""
    lacking = [n for n in needs if n not in supports]
    if lacking:
        raise NotSupported(f"the backend does not support {', '.join(lacking)}")


def config_needs(config: Config) -> tuple[str, str]:
    """A model's kind and its activation dtype, the capabilities loading it needs."""
    return "decoder_only" if config.decoder_only else "encoder_decoder", config.dtype


class CheckedModel:
    """A backend's model, each method call first checked against what the backend supports."""

    def __init__(self, model, supports: frozenset[str]):
        self._model, self.supports, self.config = model, supports, model.config

    def forward(self, src, tgt_in, intermediates=False, dropout_seed=None):
        require(self.supports, "forward", *["intermediates"] * bool(intermediates),
                *["dropout"] * (dropout_seed is not None))
        return self._model.forward(src, tgt_in, intermediates=intermediates, dropout_seed=dropout_seed)

    def __getattr__(self, name: str):
        if name in METHODS:
            require(self.supports, METHODS[name])
        return getattr(self._model, name)


class CheckedBackend:
    """A backend whose ``load`` checks the model's kind and dtype (from the file's config) and gives a
    ``CheckedModel``, whose ``sample`` needs "sample" and ``module`` "api"; its other attributes are the backend's."""

    def __init__(self, backend):
        self._backend, self.supports = backend, supported(backend)

    def load(self, path: Path) -> CheckedModel:
        try:
            config = read_config(path)
        except ValueError:  # a bad file: what the backend's own load says of it is the check
            config = None
        if config is not None:
            require(self.supports, *config_needs(config))
        return CheckedModel(self._backend.load(path), self.supports)

    def sample(self, logits, u, temperature, top_k, top_p):
        require(self.supports, "sample")
        return self._backend.sample(logits, u, temperature, top_k, top_p)

    def __getattr__(self, name: str):
        if name == "module":
            require(self.supports, "api")
        return getattr(self._backend, name)
