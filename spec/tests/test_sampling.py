"""spec.sampling: the arguments' checks, the host uniforms, and each stage's definition on small cases."""

from __future__ import annotations

import numpy as np
import pytest

from spec import sampling
from spec.numerics import Numerics

EXACT, F32 = Numerics("exact"), Numerics("float32")


@pytest.mark.parametrize("args, pattern", [
    ((-0.5, None, 1.0, 0), "temperature must be a finite number >= 0, got -0.5"),
    ((float("nan"), None, 1.0, 0), "temperature must be a finite number >= 0, got nan"),
    ((float("inf"), None, 1.0, 0), "temperature must be a finite number >= 0, got inf"),
    ((True, None, 1.0, 0), "temperature must be a finite number >= 0, got True"),
    ((1.0, 0, 1.0, 0), r"top_k must be None or an int >= 1, got 0"),
    ((1.0, 2.5, 1.0, 0), r"top_k must be None or an int >= 1, got 2.5"),
    ((1.0, None, 0.0, 0), r"top_p must lie in \(0, 1\], got 0.0"),
    ((1.0, None, 1.5, 0), r"top_p must lie in \(0, 1\], got 1.5"),
    ((1.0, None, float("nan"), 0), r"top_p must lie in \(0, 1\], got nan"),
    ((1.0, None, 1.0, -1), r"seed must be an int in \[0, 2\*\*64\), got -1"),
    ((1.0, None, 1.0, 2**64), r"seed must be an int in \[0, 2\*\*64\), got 18446744073709551616"),
])
def test_bad_arguments_are_refused(args, pattern):
    with pytest.raises(ValueError, match=pattern):
        sampling.check_sampling(*args)


def test_uniforms_depend_on_seed_row_and_step_only():
    u = sampling.uniforms(7, 3, 4)
    assert u.shape == (3, 4) and ((0 <= u) & (u < 1)).all()
    np.testing.assert_array_equal(sampling.uniforms(7, 5, 6)[:3, :4], u)   # other batch and step counts
    assert not np.array_equal(sampling.uniforms(8, 3, 4), u)
    assert len(np.unique(u)) == u.size


def _logits(*z: float) -> np.ndarray:
    return np.array([[-np.inf, -np.inf, *z]])  # ids 0, 1: pad and BOS, never drawn


def test_temperature_zero_top_k_one_and_a_small_top_p_are_the_argmax():
    z = _logits(0.5, 2.0, 1.0, 2.0)  # ids 3 and 5 tie: the lower id
    for u in (0.0, 0.5, 0.999):
        for args in ((0.0, None, 1.0), (1.0, 1, 1.0), (1.0, None, 1e-6)):
            assert sampling.sample(z, np.array([u]), *args, EXACT)[0] == 3


def test_the_draw_is_the_inverse_cdf_in_descending_order():
    """p = softmax(0, log 2, log 3, log 4) / 1 = (.1, .2, .3, .4), drawn in order ids 5, 4, 3, 2."""
    z = _logits(0.0, np.log(2), np.log(3), np.log(4))
    bounds = {0.0: 5, 0.39: 5, 0.41: 4, 0.69: 4, 0.71: 3, 0.89: 3, 0.91: 2, 0.9999: 2}
    for u, token in bounds.items():
        assert sampling.sample(z, np.array([u]), 1.0, None, 1.0, EXACT)[0] == token, u


def test_top_k_and_top_p_cut_then_renormalise():
    z = _logits(0.0, np.log(2), np.log(3), np.log(4))
    # top-k 2: ids 5, 4 with (4, 3) / 7
    assert sampling.sample(z, np.array([4 / 7 - 1e-9]), 1.0, 2, 1.0, EXACT)[0] == 5
    assert sampling.sample(z, np.array([4 / 7 + 1e-9]), 1.0, 2, 1.0, EXACT)[0] == 4
    # top-p 0.6: 0.4 + 0.3 = 0.7 >= 0.6, so ids 5, 4 again; top-p 0.7 exactly keeps the same two
    for p in (0.6, 0.7 - 1e-9):
        assert sampling.sample(z, np.array([0.999]), 1.0, None, p, EXACT)[0] == 4


def test_temperature_sharpens_and_flattens():
    z = _logits(0.0, 1.0)
    t = {}
    sampling.sample(z, np.array([0.5]), 0.5, None, 1.0, EXACT, t)
    p_top = 1 / (1 + np.exp(-2.0))                          # softmax of (0, 2) at T = 0.5
    assert t["rows"][0]["u_margin"] == pytest.approx(p_top - 0.5)


def test_frequencies_follow_the_filtered_distribution():
    """2000 rows of host uniforms: each token's share within 5 standard deviations of its probability."""
    z = np.repeat(_logits(0.0, 1.0, 2.0, 0.5), 2000, axis=0)
    u = sampling.uniforms(3, 2000, 1)[:, 0]
    tokens = sampling.sample(z, u, 1.0, 3, 1.0, F32)
    kept = np.exp([1.0, 2.0, 0.5]) / np.exp([1.0, 2.0, 0.5]).sum()  # id 2 (logit 0.0) dropped by top-k 3
    for token, p in zip((2, 3, 4, 5), (0.0, *kept), strict=True):
        share = (tokens == token).mean()
        assert abs(share - p) <= 5 * np.sqrt(p * (1 - p) / 2000) + 1e-12, (token, share, p)


def test_exact_and_faithful_agree_away_from_the_boundaries():
    rng = np.random.default_rng(0)
    z = rng.standard_normal((200, 30)).astype(np.float32).astype(np.float64)
    z[:, :2] = -np.inf
    u, trace = sampling.uniforms(11, 200, 1)[:, 0], {}
    exact = sampling.sample(z, u, 0.8, 10, 0.9, EXACT, trace)
    faithful = sampling.sample(z, u, 0.8, 10, 0.9, F32)
    safe = np.array([min(r.values()) > 1e-5 for r in trace["rows"]])
    assert safe.mean() > 0.9
    np.testing.assert_array_equal(exact[safe], faithful[safe])
