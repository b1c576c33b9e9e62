"""LayerNorm statistics' mutants (``conformance.mutants``), as ``conformance.mutations``': each replaces
``spec.reference``'s ``LayerNorm.forward``, looked up at call time. Each computes what a plausible backend would
in place of rule 6's two-pass fp32 statistics, ``mean((x - mean(x))^2)``; the normalisation around them is the
reference's. Only the golden cases whose rows carry a mean 10^3-10^4 times their spread
(``layer_add_norm_cancel_*``) see the first."""

from __future__ import annotations

import numpy as np

from spec.reference import layers

_original = {"layers.LayerNorm.forward": layers.LayerNorm.forward}
F32 = np.float32


def _normalize(norm, x, mu, var, eps_outside=False):
    # the reference's normalisation around given statistics (fp32 values held in float64)
    sigma = np.sqrt(var) + norm.eps if eps_outside else np.sqrt(var + norm.eps)
    return norm.nx.act((x - mu) / sigma * norm.scale + norm.bias)


def _one_pass_variance_in_fp32(self, x):
    if self.nx.mode == "exact":
        return _original["layers.LayerNorm.forward"](self, x)
    # E[x^2] - E[x]^2 in fp32, clamped at zero as one-pass kernels do: cancels where the mean dwarfs the spread
    x32 = x.astype(F32)
    mu = x32.mean(axis=-1, keepdims=True, dtype=F32)
    var = np.maximum((x32 * x32).mean(axis=-1, keepdims=True, dtype=F32) - mu * mu, F32(0))
    return _normalize(self, x, mu.astype(np.float64), var.astype(np.float64))


def _variance_without_mean_subtraction(self, x):
    if self.nx.mode == "exact":
        return _original["layers.LayerNorm.forward"](self, x)
    # the second moment E[x^2] in fp32 taken for the variance (RMSNorm's statistic), the mean still subtracted
    x32 = x.astype(F32)
    var = (x32 * x32).mean(axis=-1, keepdims=True, dtype=F32)
    return _normalize(self, x, x.mean(axis=-1, keepdims=True), var.astype(np.float64))


def _epsilon_outside_square_root(self, x):
    # (x - mean) / (sqrt(var) + eps), not / sqrt(var + eps): differs where var is near eps or below it
    mu = x.mean(axis=-1, keepdims=True)
    return _normalize(self, x, mu, ((x - mu) ** 2).mean(axis=-1, keepdims=True), eps_outside=True)


NORM_MUTANTS: dict[str, tuple] = {
    "layer_norm_one_pass_variance_in_fp32": ("layers.LayerNorm.forward", _one_pass_variance_in_fp32),
    "layer_norm_variance_without_mean_subtraction": ("layers.LayerNorm.forward", _variance_without_mean_subtraction),
    "layer_norm_epsilon_outside_square_root": ("layers.LayerNorm.forward", _epsilon_outside_square_root),
}
