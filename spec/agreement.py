"""Lower bounds: a backend that skips a rounding of the contract, or adds one, fails here.

The error bounds of ``spec.tolerance`` are upper bounds: a backend that skips a rounding is closer to float64 and
passes them. Two observations see it.

Rounding points (``AGREEMENT_MIN``). At a bf16 rounding point computed from given bf16 inputs (a bf16 layer case,
whose folder stores the faithful reference's output) a conformant backend equals the faithful reference bit for
bit but where an fp32 sum order moved a value across a rounding boundary, a flip that spreads only through the
rest of the layer. Measured on the CPU: 100% of each such output in every backend. A residual sum left in fp32
agrees on 69.9% of ``add_norm``, 45.8% of ``encoder_layer``, 35.3% of ``decoder_layer``; LayerNorm statistics in
bf16 on 87.9%, 51.6%, 36.6%. 0.9 leaves room for other sum orders: the forward cases' first encoder layer, where
LayerNorm's flips pass through a sublayer, agrees on at least 90.3% in every backend.

fp32 weight gradients in mixed precision (``BF16_GRADIENT_MAX``). A weight matrix's gradient, summed in fp32 over
many products of bf16 values, has nonzero low mantissa bits almost everywhere; one rounded to bf16 on its way
(autodiff through a cast, a bf16 accumulator) is a bf16 value everywhere. Measured on the mixed-precision golden
training cases: at most 1.2% of a matrix's nonzero elements are bf16 values, in every backend; rounded, 100%. The
bound is 0.5. Vectors are judged too: a bias's or a LayerNorm parameter's gradient sums fewer bf16 cotangents and
is more often exact in bf16 (up to 25% of the elements in the faithful reference and in a conformant backend), still
far under the bound. A gradient whose faithful share is over the bound is not judged: one that is 0 in exact
arithmetic (an attention's key bias b_k: softmax ignores a constant added to a query's scores) is cancellation
residue, 86-97% bf16 values in the faithful reference.

fp32 logits of a bf16 model (``BF16_LOGITS_MAX``). The output projection accumulates in fp32 and its logits stay
fp32 (``spec.numerics``); rounded to bf16 on their way out they are bf16 values everywhere, an error the bounds do
not see where the bf16 activations before it dominate (2-5 bf16 ulps against limits of 8-21 on the golden forward
cases). Measured on the bf16 golden forward and incremental cases: at most 0.12% of the faithful reference's logits
are bf16 values. The bound is 0.5.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

AGREEMENT_MIN = 0.9
BF16_GRADIENT_MAX = 0.5
BF16_LOGITS_MAX = 0.5


def agreement(actual: np.ndarray, faithful: np.ndarray) -> float:
    """The fraction of elements of ``actual`` equal to ``faithful`` (the faithful reference's), bit for bit; 1.0 for
    none. A conformant bf16 backend reaches ``AGREEMENT_MIN``.

    Raises:
        ValueError: if the shapes differ.
    """
    a, f = np.asarray(actual, np.float64), np.asarray(faithful, np.float64)
    if a.shape != f.shape:
        raise ValueError(f"shape {a.shape} differs from the faithful {f.shape}")
    return float((a == f).mean()) if a.size else 1.0


def bf16_representable(gradient: np.ndarray) -> float:
    """The fraction of the nonzero elements of an fp32 ``gradient`` (or logits) that are exactly bf16 values (0.0 for
    none). A conformant mixed-precision backend's weight matrices stay at most ``BF16_GRADIENT_MAX``, a bf16 model's
    logits at most ``BF16_LOGITS_MAX``."""
    g = np.asarray(gradient, np.float32)
    g = g[g != 0]
    return float((g.astype(ml_dtypes.bfloat16).astype(np.float32) == g).mean()) if g.size else 0.0
