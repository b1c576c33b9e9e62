"""The decoder-only model's and sampling's mutants (``conformance.mutants``), as ``conformance.mutations``': each
replaces a function or method of ``spec.reference`` or ``spec.sampling``, looked up at call time."""

from __future__ import annotations

import numpy as np

from spec import sampling
from spec.reference import stacks

_original = {"sampling._sample_row": sampling._sample_row, "stacks.Stack.__init__": stacks.Stack.__init__}


def _causal_mask_off_by_one(start, n, length):
    q_pos = np.arange(start, start + n)[:, None]
    return (np.arange(length)[None, :] <= q_pos + 1)[None]  # each query sees the next position too


def _temperature_after_softmax(z, u, temperature, top_k, top_p, nx):
    # probabilities divided by T and renormalised: the distribution of temperature 1, whatever T
    return _original["sampling._sample_row"](z, u, 1.0, top_k, top_p, nx)


def _top_p_exclusive_cumsum(cum, top_p):
    # the tokens whose cumulative probability stays below p: the token that reaches p is left out
    return max(1, int(np.searchsorted(cum, top_p, side="left"))) if top_p < 1.0 else len(cum)


def _descending_ties_to_higher_id(z):
    return len(z) - 1 - np.argsort(-z[::-1], kind="stable")


def _final_norm_missing(self, params, c, nx, layer, name, n):
    _original["stacks.Stack.__init__"](self, params, c, nx, layer, name, n)
    self.final_norm = None  # a pre-LN stack's output goes out unnormalised


def _uniforms_of_the_framework(seed, batch, steps):
    return np.random.default_rng(seed).random((batch, steps))  # a generator's own stream, not the spec's Philox


LM_MUTANTS: dict[str, tuple] = {
    "causal_mask_off_by_one": ("stacks.causal_mask", _causal_mask_off_by_one),
    "temperature_after_softmax": ("sampling._sample_row", _temperature_after_softmax),
    "top_p_exclusive_cumsum": ("sampling.top_p_count", _top_p_exclusive_cumsum),
    "top_k_ties_to_higher_id": ("sampling.descending", _descending_ties_to_higher_id),
    "final_layer_norm_missing": ("stacks.Stack.__init__", _final_norm_missing),
    "sampling_rng_not_the_spec_uniforms": ("sampling.uniforms", _uniforms_of_the_framework),
}
