"""Shape-annotated array types for the impls' signatures, ``Float[Tensor, "B T V"]`` with the letters of
``spec.config``.

With jaxtyping installed these are jaxtyping's (type checkers and its runtime checks read the shapes); without it
``Float[Tensor, "B T V"]`` is plain ``Tensor``, so ``typing.get_type_hints`` resolves an impl's signatures either way.
"""

from __future__ import annotations

from typing import Any

try:
    from jaxtyping import Bool, Float, Int
except ImportError:
    class _Shaped:
        """``Kind[array_type, "shape"]`` -> ``array_type``."""

        def __class_getitem__(cls, item: tuple[Any, str]) -> Any:
            return item[0]

    class Bool(_Shaped):
        """A bool array of the given shape."""

    class Float(_Shaped):
        """A floating-point array of the given shape."""

    class Int(_Shaped):
        """An integer array of the given shape."""

__all__ = ["Bool", "Float", "Int"]
