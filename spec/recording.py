"""Recording intermediates by canonical name (``spec.shapes.intermediates``), the one way every impl uses.

Context variables, not an argument threaded through every layer: production signatures carry no
bookkeeping, and ``record`` costs one lookup when nothing records. Framework-neutral: ``record`` keeps a
reference to whatever it is given (a tensor, a ``jax`` tracer inside a trace, a graph tensor inside a
``tf.function``). Under a compiler, record at trace time inside the compiled function and return the dict
from it.

    with recording() as rec:                    # the forward with intermediates
        with scope("encoder.layers.0"):
            x = record("out", layer(x))         # rec["encoder.layers.0.out"] is x
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any, TypeVar

X = TypeVar("X")

_RECORDING: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("spec.recording", default=None)
_SCOPE: contextvars.ContextVar[str] = contextvars.ContextVar("spec.scope", default="")


@contextlib.contextmanager
def recording() -> Iterator[dict[str, Any]]:
    """Collect what is ``record``ed in the block, by scoped name; an inner block collects apart from outer ones."""
    rec: dict[str, Any] = {}
    token = _RECORDING.set(rec)
    try:
        yield rec
    finally:
        _RECORDING.reset(token)


@contextlib.contextmanager
def scope(prefix: str) -> Iterator[None]:
    """Names recorded in the block are prefixed with ``prefix + "."`` (nested scopes join with dots)."""
    token = _SCOPE.set(f"{_SCOPE.get()}{prefix}.")
    try:
        yield
    finally:
        _SCOPE.reset(token)


def record(name: str, x: X) -> X:
    """``x``; while ``recording``, also stored under the scoped name (a no-op otherwise)."""
    rec = _RECORDING.get()
    if rec is not None:
        rec[_SCOPE.get() + name] = x
    return x


def scoped(name: str) -> str:
    """``name`` as ``record`` would store it here: prefixed with the enclosing scopes."""
    return _SCOPE.get() + name
