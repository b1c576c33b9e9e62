"""The live oracle: private copies of the spec modules that checks computing the spec's answer at test time use
(``spec.reference``, ``spec.search``, and the training run of ``spec.trajectory`` and ``spec.golden_training``
with ``spec.training`` and ``spec.backward``). ``--mutant`` patches the shared modules for the reference backend
under test; it must never reach the oracle a backend is judged against."""

from __future__ import annotations

import importlib
import sys

_COPIED = ("spec.reference", "spec.search", "spec.training", "spec.backward_layers", "spec.backward",
           "spec.trajectory", "spec.golden_training")


def _private_copies(names: tuple[str, ...]) -> list:
    """Fresh instances of these spec modules (a package with its submodules), importing one another; the shared
    ones stay in ``sys.modules`` and on their parent package."""
    ours = lambda n: any(n == m or n.startswith(f"{m}.") for m in names)  # noqa: E731
    shared = {n: sys.modules.pop(n) for n in [n for n in sys.modules if ours(n)]}
    try:
        return [importlib.import_module(n) for n in names]
    finally:
        for n in [n for n in sys.modules if ours(n)]:
            del sys.modules[n]
        sys.modules.update(shared)
        for n in names:  # each import bound its fresh copy on the parent package: `from spec import x` reads it
            parent, _, child = n.rpartition(".")
            if n in shared:
                setattr(sys.modules[parent], child, shared[n])
            else:
                vars(sys.modules[parent]).pop(child, None)


ref, search, training, backward_layers, backward, trajectory, golden_training = _private_copies(_COPIED)
