"""Where the NumPy reference rounds: the products of the numerics contract (``spec.numerics``), one place.

Values are float64 arrays holding numbers representable in the dtype they were last rounded to; ``nx`` (a
``spec.numerics.Numerics``) says where to round: never ("exact"), or at the contract's points. Products are
``np.einsum``, not ``@``: NumPy's own loops sum in one order on every machine, while BLAS picks kernels by CPU
(docs/decisions-ref.md), and the golden files must regenerate bit for bit anywhere.
"""

from __future__ import annotations

import numpy as np

from spec.numerics import Numerics, np_dtype

# x (B, L, *N) . w (*N, *M) by the ranks of x and w; a two-axis contraction lists its axes as (c, h): einsum
# orders the summed axes by label.
_LINEAR = {(3, 2): "bld,df->blf", (3, 3): "bld,dhk->blhk", (4, 3): "blhc,hcd->bld"}


def round_to(p: np.ndarray, dtype: str) -> np.ndarray:
    """Rule 0: a parameter as it enters the computation in ``dtype``, held as an exact float64 copy."""
    return np.asarray(p).astype(np_dtype(dtype)).astype(np.float64)


def linear(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None, *, nx: Numerics) -> np.ndarray:
    """x (B, L, D) . w (D, F) or (D, H, K), or x (B, L, H, C) . w (H, C, D), plus ``bias``: the exact sum
    rounded once to the activation dtype, after the bias (rule 2)."""
    y = np.einsum(_LINEAR[x.ndim, w.ndim], x, w)
    return nx.act(y if bias is None else y + bias)


def logits(x: np.ndarray, table: np.ndarray, bias: np.ndarray | None = None, *, nx: Numerics) -> np.ndarray:
    """The tied output product x (B, T, D) . table (V, D)^T, plus ``bias`` (V), -> (B, T, V): the exact sum
    rounded to fp32 only (rule 7)."""
    y = np.einsum("bnd,vd->bnv", x, table)
    return nx.acc(y if bias is None else y + bias)


def matmul_f32(subscripts: str, a: np.ndarray, b: np.ndarray, *, nx: Numerics) -> np.ndarray:
    """An activation x activation product (``np.einsum`` ``subscripts``), its exact sum rounded to the fp32
    accumulator (rules 4, 7)."""
    return nx.acc(np.einsum(subscripts, a, b))
