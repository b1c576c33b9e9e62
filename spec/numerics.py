"""The numerics contract, and the rounding helpers the NumPy reference uses.

Every backend follows this contract.

0. Parameters are stored in ``param_dtype`` and enter the computation in
   ``dtype``: each is cast once, where it is read (fp32 -> bf16 rounds to
   nearest even; bf16 -> fp32 is exact), and the rules of ``dtype`` apply from
   there on. So ``dtype="bfloat16", param_dtype="float32"`` (fp32 master
   weights, as mixed-precision training keeps them) computes exactly what the
   bf16 model with the rounded weights computes, and ``dtype="float32",
   param_dtype="bfloat16"`` computes in float32 throughout. The activation
   dtype is always ``dtype``, never taken from a parameter.

In ``dtype="bfloat16"`` mode:

1. Parameters and the activations between sublayers are bf16.
2. Every matrix product takes bf16 operands, accumulates in fp32 and is rounded
   to bf16 once, after its bias (if any) is added. Exceptions: attention scores
   (rule 4) and logits (rule 7). The FFN's activation (``config.activation``)
   takes the rounded hidden units, is computed in fp32 and rounded to bf16
   once (ReLU is exact).
3. Embedding: ``E[ids] * sqrt(d_model) + PE`` is computed in fp32 and rounded
   to bf16 once. PE is the paper's interleaved table (section 3.5):
   ``PE[pos, 2i] = sin(pos / 10000^(2i/d_model))``, ``PE[pos, 2i+1] = cos(...)``,
   positions from 0, held in fp32. ``config.positions="sinusoidal_halves"``
   puts the D/2 sines first and the D/2 cosines after;
   ``"learned"`` takes the rows of the ``position_embedding`` parameter
   instead. Without ``config.scale_embedding`` the factor sqrt(d_model) is 1.
4. Attention: scores ``Q K^T`` stay fp32 (never rounded to bf16), are scaled by
   ``1/sqrt(d_k)`` in fp32, masked, and go through a max-subtracted softmax in
   fp32; the probabilities are rounded to bf16 before ``P V``. Masks are
   boolean, True = may attend. Masked keys get exactly zero weight: their
   scores are replaced by the most negative finite fp32 (``MASKED_SCORE``), so
   a query row with every key masked (a padding query) gets finite output.
   Outputs at padding query positions are unspecified but finite.
5. Residual add of two bf16 values is rounded to bf16.
6. LayerNorm: statistics and normalisation in fp32, result rounded to bf16.
   The statistics take two passes, the mean and then the mean of
   ``(x - mean)^2``, not ``E[x^2] - E[x]^2`` (which cancels where a row's mean
   dwarfs its spread) nor running (Welford) updates, whose rounded divisions
   leave the mean off by about an fp32 ulp of itself, an error that the
   normalisation divides by the spread.
7. Logits: final hidden (bf16) times ``E^T`` with fp32 accumulation, plus
   the ``logits_bias`` parameter if ``config.logits_bias``, returned as
   float32 and never rounded to bf16.
8. Dropout is the identity in evaluation. fp32 checks on GPUs run with TF32
   off.

In ``dtype="float32"`` mode the same formulas run in float32 throughout.

The reference models an *ideal* implementation of the contract: between two
rounding points it computes in float64 (exact products, exact sums), and at a
rounding point it rounds to fp32 (the accumulator) and then to the activation
dtype, as hardware with an fp32 accumulator does. A real backend differs from
it only by the order of its fp32 accumulations and its fp32 transcendental
functions, which is what the tolerance policy (``spec.tolerance``) bounds.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
MASKED_SCORE = float(np.finfo(np.float32).min)

# Machine epsilon (distance from 1 to the next value): bf16 has 8 significand
# bits, fp32 24.
EPS = {"bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}


def np_dtype(name: str) -> np.dtype:
    """The NumPy dtype for a config dtype name ("bfloat16" via ml_dtypes)."""
    if name == "bfloat16":
        return BF16
    if name in ("float32", "float64"):
        return np.dtype(name)
    raise ValueError(f"unknown dtype {name!r}")


class Numerics:
    """Where the reference rounds: ``mode`` is "exact", "bfloat16" or "float32".

    "exact" never rounds (float64 throughout). "bfloat16" and "float32" round
    at the contract's points. Values are always held in float64 arrays, exactly
    representable in the dtype they were last rounded to.
    """

    def __init__(self, mode: str):
        if mode not in ("exact", "bfloat16", "float32"):
            raise ValueError(f"unknown numerics mode {mode!r}")
        self.mode = mode

    def acc(self, x: np.ndarray) -> np.ndarray:
        """Round to the fp32 accumulator (identity in exact mode)."""
        if self.mode == "exact":
            return np.asarray(x, np.float64)
        return np.asarray(x, np.float64).astype(np.float32).astype(np.float64)

    def act(self, x: np.ndarray) -> np.ndarray:
        """Round to the activation dtype via fp32, as hardware does."""
        if self.mode != "bfloat16":
            return self.acc(x)
        return self.acc(x).astype(BF16).astype(np.float64)

    @property
    def act_dtype(self) -> np.dtype:
        return np.dtype(np.float64) if self.mode == "exact" else np_dtype(self.mode)
