"""Tolerance policy: how far a backend may be from the float64 ("exact") result.

Errors are measured against the exact result, never against another backend,
in units of the dtype's epsilon times the tensor's scale (``spec.errors``):
one unit is about one rounding of a typical element. For each checked
tensor the golden file stores the bf16- (or fp32-) faithful reference's own
error against exact: the error of an *ideal* implementation of the contract,
one that rounds only where ``spec.numerics`` says. A backend passes when

    max err_eps  <= max(MAX_RATIO * faithful max err_eps, FLOOR_EPS)
    rms err_eps  <= RMS_RATIO * faithful rms err_eps + FLOOR_EPS / sqrt(n)    (bf16 only)

where n is the number of elements judged.

Why these numbers (per dtype):

bfloat16. A backend that follows the contract differs from the ideal only in
the order of its fp32 accumulations and in its fp32 exp/sqrt. Those errors
are ~2^16 times smaller than a bf16 rounding, so they change the rounded bf16
result only where the exact value lies within ~2^-16 ulp of a rounding
boundary; when they do, the changed element is off by one bf16 ulp and the
flip propagates through later layers like any other rounding error. Its RMS
error therefore matches the ideal's within sampling noise: RMS_RATIO = 1.5
leaves room for that noise on tensors of a few hundred elements. The maximum
over a tensor is dominated by a few propagated flips: MAX_RATIO = 4.
FLOOR_EPS = 1 covers tensors whose ideal max error is near zero (a single
rounding), where a flip costs one ulp.

The RMS bound's allowance beyond the ratio is one flip: one element off by
one more ulp raises the RMS error of n elements by 1/sqrt(n) ulps, which is
sampling noise, not a broken rounding, when n is small (a random config's
handful of logits). The allowance is
not a floor such as max(1.5 x faithful RMS, 1 ulp): on tensors of hundreds of
elements a floor allows several times the ideal's RMS error, room for a
forbidden rounding (the measurements: docs/decisions.md, "Tolerances"). With
n >= 448 in every golden tensor, one flip adds at most 0.047 ulps.

An extra rounding the contract forbids is not always visible at ordinary
magnitudes: attention scores rounded to bf16 stayed within these bounds on
every forward case (docs/decisions.md, "Tolerances"). The golden set
therefore holds cases built to expose such roundings (attention scores with a
common offset; layers alone whose output is fp32, judged in fp32 ulps), and
the mutation test proves they fail. These are upper bounds: a backend that
skips a rounding is closer to exact and passes them; ``spec.agreement`` holds
the lower bounds that see it.

float32. The ideal rounds once per contract point; a real fp32 backend rounds
at every addition of its reductions (error up to ~log2(n) roundings for a
blocked sum of n <= 4096 terms, ~12) and in its transcendental functions.
MAX_RATIO = 16 with FLOOR_EPS = 8. No RMS criterion: an fp32 backend's error is
not made of the same roundings as the ideal's.

Positional encoding alone is the exception: a backend may compute
``sin(pos * w)`` in fp32, whose argument carries an absolute error up to
~2 * EPS32 * pos; the sine is 1-Lipschitz. ``PE_ABS_PER_POSITION`` bounds it:
|PE - exact| <= 4 * EPS32 * max_position + EPS32. (Added to E*sqrt(D), whose bf16
ulp is ~2^-5, this error is invisible in bf16.)

Decisions (argmax, beam cuts) are compared exactly, only where the golden
case's recorded margin (``spec.search``) exceeds ``DECISION_MARGIN_FACTOR``
times the logits tolerance: two backends each within tolerance of exact
cannot order two scores differently when their exact gap exceeds twice the
tolerance.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from spec.errors import ErrorStats, error_stats, update_error_stats
from spec.numerics import EPS

MAX_RATIO = {"bfloat16": 4.0, "float32": 16.0}
RMS_RATIO = {"bfloat16": 1.5, "float32": None}
FLOOR_EPS = {"bfloat16": 1.0, "float32": 8.0}
PE_ABS_PER_POSITION = 4 * EPS["float32"]
DECISION_MARGIN_FACTOR = 2.0


@dataclasses.dataclass(frozen=True)
class Verdict:
    ok: bool
    stats: ErrorStats
    max_eps_allowed: float
    rms_eps_allowed: float | None
    ratio: float  # backend max err / faithful max err; 1.0 for the faithful reference itself

    def reason(self) -> str:
        s = self.stats
        msg = f"max err {s.max_eps:.3g} eps (allowed {self.max_eps_allowed:.3g})"
        if self.rms_eps_allowed is not None:
            msg += f", rms err {s.rms_eps:.3g} eps (allowed {self.rms_eps_allowed:.3g})"
        return msg


def judge(actual: np.ndarray, exact: np.ndarray, faithful: ErrorStats) -> Verdict:
    """Apply the policy to one tensor. ``faithful`` is the ideal's error (from the golden file),
    in the unit (dtype eps) the tensor is judged in."""
    dtype = faithful.unit
    stats = error_stats(actual, exact, dtype)
    max_allowed = max(MAX_RATIO[dtype] * faithful.max_eps, FLOOR_EPS[dtype])
    flip = FLOOR_EPS[dtype] / np.sqrt(np.size(actual))
    rms_allowed = None if RMS_RATIO[dtype] is None else RMS_RATIO[dtype] * faithful.rms_eps + flip
    ok = stats.max_eps <= max_allowed and (rms_allowed is None or stats.rms_eps <= rms_allowed)
    ratio = stats.max_eps / faithful.max_eps if faithful.max_eps > 0 else (0.0 if stats.max_eps == 0 else np.inf)
    return Verdict(bool(ok), stats, max_allowed, rms_allowed, float(ratio))


def judge_positional_encoding(actual: np.ndarray, exact: np.ndarray) -> Verdict:
    """The PE table's absolute bound (module docstring)."""
    stats = error_stats(actual, exact, "float32")
    bound = PE_ABS_PER_POSITION * (exact.shape[0] - 1) + EPS["float32"]
    allowed_eps = bound / (EPS["float32"] * stats.scale)
    return Verdict(stats.max_abs <= bound, stats, allowed_eps, None, stats.max_abs / bound)


def logits_tolerance_abs(faithful: ErrorStats) -> float:
    """The largest absolute logit error ``judge`` admits, given the ideal's error."""
    u = faithful.unit
    return max(MAX_RATIO[u] * faithful.max_eps, FLOOR_EPS[u]) * EPS[u] * faithful.scale


# ----------------------------------------------------------------- training (spec.golden_training)
#
# Loss and gradients are judged like forward tensors, in ulps of the config's dtype at the tensor's scale
# (``error_stats``), against the faithful backward's own error (``spec.backward``'s ideal: the faithful forward,
# each VJP product rounded once, cotangents in the dtype of what they differentiate, fp32 weight gradients):
#
#     max err_eps <= max(GRAD_MAX_RATIO * faithful max, GRAD_FLOOR_EPS)
#     rms err_eps <= GRAD_RMS_RATIO * faithful rms + GRAD_FLOOR_EPS / sqrt(n)
#
# float32: the forward's numbers for the forward's reason (a real fp32 backend rounds at every addition of its
# blocked reductions, the ideal once per product), and an RMS bound at the same ratio.
#
# bfloat16 (mixed precision): the forward's MAX_RATIO 4 and floor; GRAD_RMS_RATIO 2, not 1.5, because where a
# backward rounds is not part of the contract and sound placements differ (torch.autocast rounds each weight
# gradient to bf16 before its fp32 accumulation; the ideal keeps it in fp32).
#
# Weights after Adam steps are judged in units of the summed learning rate of those steps (``update_error_stats``,
# unit "update"): one unit is how far the steps may move a weight. Not in ulps of the weight (an fp32 weight's
# ulp is a tiny fraction of a step, so a weight-relative unit would hide a wrong step), and not relative to the
# ideal's error alone: Adam divides by sqrt(v) + eps, so the first step moves a weight by lr * g / (|g| + eps), lr
# times the sign of g, and where |g| is below the gradient tolerance a conformant backend may take the other sign
# and land 2 lr away. Like decisions in decoding, such elements are set apart: the golden case stores, per weight,
# the mask of "undecided" elements (an exact gradient, at some step, within UPDATE_MARGIN times its tolerance of
# zero, or within UPDATE_EPS_SENSITIVE * adam_eps, where the step's size depends on eps). Then
#
#     decided:   max err <= max(UPDATE_MAX_RATIO * faithful max, UPDATE_FLOOR)
#                rms err <= UPDATE_RMS_RATIO * faithful rms + UPDATE_FLOOR / sqrt(n decided)
#     undecided: max err <= UPDATE_FLIP
#
# UPDATE_FLIP = 2.5: a step of the other sign moves a weight 2 |m_hat / sqrt(v_hat)| lr away, and that ratio stays
# near 1 over the case's steps. UPDATE_MARGIN = 10: a gradient 10 tolerances from zero keeps its sign, and the step
# its size to ~10%. UPDATE_FLOOR = 1e-3: above a weight's fp32 rounding and the ideal's worst decided error. The
# ratios are the gradients'. What the weights catch that the gradients cannot, and what they miss (in mixed
# precision, and after the first step, few weights are decided), with the measurements behind every number here:
# docs/decisions.md, "Training tolerances".

GRAD_MAX_RATIO = {"bfloat16": 4.0, "float32": 16.0}
GRAD_RMS_RATIO = {"bfloat16": 2.0, "float32": 16.0}
GRAD_FLOOR_EPS = {"bfloat16": 1.0, "float32": 8.0}
UPDATE_MAX_RATIO = {"bfloat16": 4.0, "float32": 16.0}
UPDATE_RMS_RATIO = {"bfloat16": 2.0, "float32": 16.0}
UPDATE_FLOOR = 1e-3
UPDATE_FLIP = 2.5
UPDATE_MARGIN = 10.0
UPDATE_EPS_SENSITIVE = 1000.0   # times adam_eps


def gradient_tolerance_abs(faithful: ErrorStats) -> float:
    """The largest absolute error ``judge_gradient`` admits on one element of a gradient, given the ideal's error."""
    u = faithful.unit
    return max(GRAD_MAX_RATIO[u] * faithful.max_eps, GRAD_FLOOR_EPS[u]) * EPS[u] * faithful.scale


def judge_gradient(actual: np.ndarray, exact: np.ndarray, faithful: ErrorStats) -> Verdict:
    """A backend's loss or gradient tensor against the float64 ``exact``, given the ideal's error ``faithful``
    (from the golden case's meta, unit the config's dtype). The policy above.

    Raises:
        ValueError: if the shapes differ or ``faithful.unit`` is not a dtype.
    """
    u = faithful.unit
    if u not in GRAD_MAX_RATIO:
        raise ValueError(f"judge_gradient: faithful error in unit {u!r}; want 'bfloat16' or 'float32'")
    stats = error_stats(actual, exact, u)
    max_allowed = max(GRAD_MAX_RATIO[u] * faithful.max_eps, GRAD_FLOOR_EPS[u])
    rms_allowed = GRAD_RMS_RATIO[u] * faithful.rms_eps + GRAD_FLOOR_EPS[u] / np.sqrt(np.size(actual))
    ok = stats.max_eps <= max_allowed and stats.rms_eps <= rms_allowed
    return Verdict(bool(ok), stats, float(max_allowed), float(rms_allowed), _ratio(stats, faithful))


def judge_update(actual: np.ndarray, exact: np.ndarray, faithful: ErrorStats, dtype: str, undecided: np.ndarray
                 ) -> Verdict:
    """A backend's weights after Adam steps against the float64 ``exact``, given the ideal's error on the decided
    elements ``faithful`` (unit "update"), the config's ``dtype`` and the bool mask of ``undecided`` elements, all
    from the golden case. The policy above; the verdict's stats are the decided elements'.

    Raises:
        ValueError: if the shapes differ, ``faithful.unit`` is not "update" or ``dtype`` is unknown.
    """
    a, x, undecided = np.asarray(actual, np.float64), np.asarray(exact, np.float64), np.asarray(undecided, bool)
    if faithful.unit != "update" or dtype not in UPDATE_MAX_RATIO:
        raise ValueError(f"judge_update: unit {faithful.unit!r} (want 'update'), dtype {dtype!r}")
    if undecided.shape != x.shape or a.shape != x.shape:
        raise ValueError(f"judge_update: actual {a.shape}, exact {x.shape} and undecided {undecided.shape} differ")
    stats = update_error_stats(a[~undecided], x[~undecided], faithful.scale)
    flipped = update_error_stats(a[undecided], x[undecided], faithful.scale)
    max_allowed = max(UPDATE_MAX_RATIO[dtype] * faithful.max_eps, UPDATE_FLOOR)
    rms_allowed = UPDATE_RMS_RATIO[dtype] * faithful.rms_eps + UPDATE_FLOOR / np.sqrt(max(1, (~undecided).sum()))
    ok = stats.max_eps <= max_allowed and stats.rms_eps <= rms_allowed and flipped.max_eps <= UPDATE_FLIP
    return Verdict(bool(ok), stats, float(max_allowed), float(rms_allowed), _ratio(stats, faithful))


def _ratio(stats: ErrorStats, faithful: ErrorStats) -> float:
    if faithful.max_eps > 0:
        return float(stats.max_eps / faithful.max_eps)
    return 0.0 if stats.max_eps == 0 else float(np.inf)
