"""spec.annotations: shape annotations that resolve at run time with or without jaxtyping."""

from __future__ import annotations

import typing

import numpy as np

from spec.annotations import Bool, Float, Int


def f(x: Float[np.ndarray, "B T D"], m: Bool[np.ndarray, "B T"]) -> Int[np.ndarray, "B T"]:
    return (x.sum(-1) * m).astype(np.int64)


def test_the_hints_resolve():
    hints = typing.get_type_hints(f)
    assert set(hints) == {"x", "m", "return"}
    if Float.__module__ == "spec.annotations":  # no jaxtyping here: the annotation is the array type itself
        assert hints["x"] is np.ndarray and hints["return"] is np.ndarray
