"""``certify.adapters.flax_nnx``'s attention where the golden cases cannot reach it (their heads have d_k != d_v,
which Flax's attention does not take): ``nnx.MultiHeadAttention`` holding the canonical weights and
``nnx.dot_product_attention``, on a config with d_k == d_v, against the spec's float64 reference under the suite's
tolerance policy; and d_k != d_v raised as ``NotSupported``."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.adapters.base import NotSupported
from spec import reference as ref
from spec import tolerance
from spec.config import TINY
from spec.golden_cases import SMALL
from spec.init import init_params
from spec.numerics import Numerics
from spec.reference.layers import MultiHeadAttention, scaled_dot_product_attention

flax_nnx = pytest.importorskip("certify.adapters.flax_nnx")
PREFIX = "encoder.layers.0.self_attn"


def _inputs(c, rng):
    x = rng.standard_normal((2, 5, c.d_model)).astype(np.float32)
    mask = np.ones((2, 1, 5, 5), bool)
    mask[1, ..., 3:] = False                                                      # a key padding mask
    return x, mask


def _judge(got, run, dtype):
    exact, faithful = run(Numerics("exact")), run(Numerics(dtype))
    verdict = tolerance.judge(np.asarray(got, np.float64), exact, tolerance.error_stats(faithful, exact, dtype))
    assert verdict.ok, verdict.reason()


@pytest.mark.parametrize("dtype", ("float32", "bfloat16"))
def test_multi_head_attention_holds_the_canonical_weights(dtype):
    c = SMALL.replace(dtype=dtype, param_dtype=dtype)
    params = init_params(c, 0, observable=True)
    x, mask = _inputs(c, np.random.default_rng(0))
    x = Numerics(dtype).act(x)
    got = flax_nnx.Model(c, params).run_layer("multi_head_attention", PREFIX, {"x_q": x, "x_kv": x, "mask": mask})
    P = ref.as_float64(params, c)

    def run(nx):
        mha = MultiHeadAttention(P, PREFIX, nx)
        return mha.forward(x, mha.project_kv(x), mask[:, 0])
    _judge(got["out"], run, dtype)


@pytest.mark.parametrize("dtype", ("float32", "bfloat16"))
def test_dot_product_attention_of_equal_widths(dtype):
    rng = np.random.default_rng(1)
    q, k, v = (Numerics(dtype).act(rng.standard_normal((2, 5, 4, 8))) for _ in range(3))
    mask = _inputs(SMALL, rng)[1]
    got = flax_nnx.Model(SMALL.replace(dtype=dtype), {}).run_layer("scaled_dot_product_attention", None,
                                              {"q": q, "k": k, "v": v, "mask": mask})
    _judge(got["out"], lambda nx: scaled_dot_product_attention(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3),
                                                                mask[:, 0], nx), dtype)


def test_heads_of_two_widths_are_not_supported():
    c = TINY
    assert c.d_k != c.d_v
    x, mask = _inputs(c, np.random.default_rng(0))
    with pytest.raises(NotSupported, match="d_k="):
        flax_nnx.Model(c, init_params(c, 0)).run_layer("multi_head_attention", PREFIX,
                                                       {"x_q": x, "x_kv": x, "mask": mask})
