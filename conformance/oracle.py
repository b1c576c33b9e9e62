"""The live oracle: private copies of ``spec.reference`` and ``spec.search`` for checks that compute the spec's
answer at test time. ``--mutant`` patches the shared modules for the reference backend under test; it must never
reach the oracle a backend is judged against."""

from __future__ import annotations

import importlib
import sys


def _private_copy(name: str):
    """A fresh instance of a spec module, or of a package with its submodules; the shared one stays in
    ``sys.modules``."""
    ours = [n for n in sys.modules if n == name or n.startswith(f"{name}.")]
    shared = {n: sys.modules.pop(n) for n in ours}
    try:
        return importlib.import_module(name)
    finally:
        for n in [n for n in sys.modules if n == name or n.startswith(f"{name}.")]:
            del sys.modules[n]
        sys.modules.update(shared)
        parent, _, child = name.rpartition(".")
        if name in shared:  # the import bound the fresh copy on its parent package: bind the shared one again
            setattr(sys.modules[parent], child, shared[name])


ref = _private_copy("spec.reference")
search = _private_copy("spec.search")
search.ref = ref
