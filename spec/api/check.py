"""``check_api``: every departure of an impl module from the contract of ``spec.api``; ``compare_signature``: one
function's (a peer's, a tool's), against a reference signature of ``spec.api``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType

from spec.api import functions
from spec.api.protocols import KV_CACHE_FIELDS, DecoderOnlyModel, Model

FUNCTIONS: dict[str, Callable] = {name: getattr(functions, name) for name in functions.__all__}
METHODS: dict[str, dict[str, Callable]] = {
    "Transformer": {name: getattr(Model, name) for name in ("__call__", "encode", "init_cache", "decode")},
    "LanguageModel": {name: getattr(DecoderOnlyModel, name) for name in ("__call__", "init_cache", "decode")}}
NAMES = (*FUNCTIONS, "KVCache", "TrainState", "__version__")


def compare_signature(where: str, impl: Callable, ref: Callable, skip_self: bool) -> list[str]:
    """How ``impl``'s signature departs from ``ref``'s: the common parameters first, in order, with the same
    names, kinds and defaults; extras keyword-only with defaults."""
    skip = 1 if skip_self else 0
    got = list(inspect.signature(impl).parameters.values())[skip:]
    want = list(inspect.signature(ref).parameters.values())[skip:]
    problems = []
    for i, w in enumerate(want):
        if i >= len(got):
            problems.append(f"{where}: missing parameter {w.name!r}")
            continue
        g = got[i]
        if (g.name, g.kind, g.default) != (w.name, w.kind, w.default):
            problems.append(f"{where}: parameter {i} is {g} , the spec says {w}")
    for g in got[len(want):]:
        if g.kind != g.KEYWORD_ONLY or g.default is g.empty:
            problems.append(f"{where}: extra parameter {g} must be keyword-only with a default")
    return problems


def check_api(module: ModuleType) -> list[str]:
    """Every departure of an impl module from this API, as readable lines ([] when it conforms)."""
    name = module.__name__
    problems = [f"{name}.{n} is missing" for n in NAMES if not hasattr(module, n)]
    if problems:
        return problems
    for n, ref in FUNCTIONS.items():
        problems += compare_signature(f"{name}.{n}", getattr(module, n), ref, skip_self=False)
    for cls_name, methods in METHODS.items():
        cls = getattr(module, cls_name)
        for n, ref in methods.items():
            # torch: nn.Module.__call__ is (*args, **kwargs) and runs ``forward``, whose signature is the real one.
            impl = cls.forward if n == "__call__" and "forward" in vars(cls) else getattr(cls, n)
            problems += compare_signature(f"{name}.{cls_name}.{n}", impl, ref, skip_self=True)
    fields = getattr(module.KVCache, "_fields", None) or tuple(getattr(module.KVCache, "__dataclass_fields__", ()))
    if tuple(fields) != KV_CACHE_FIELDS:
        problems.append(f"{name}.KVCache fields are {tuple(fields)}, the spec says {KV_CACHE_FIELDS}")
    if not isinstance(module.__version__, str):
        problems.append(f"{name}.__version__ is not a string")
    return problems
