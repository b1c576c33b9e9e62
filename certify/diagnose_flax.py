"""The experiments behind ``certify.causes``' measured causes for ``certify.adapters.flax_nnx``: each runs the Flax
NNX piece a failing check ran, on that golden case's inputs, beside NumPy forms of the computation that differ in
one choice, and prints the share of its elements bit-identical to each::

    python -m certify.diagnose_flax
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from certify.adapters import flax_nnx
from conformance import golden as G
from spec import golden_cases
from spec.agreement import agreement
from spec.reference.layers import positional_encoding

BF16 = ml_dtypes.bfloat16


def _bf16(x) -> np.ndarray:
    return np.asarray(x, np.float32).astype(BF16)


def _f32(x) -> np.ndarray:
    return np.asarray(x, np.float32)


def _run(name: str):
    """The golden case ``name``, its inputs, and the adapter's outputs on them."""
    case = next(c for c in G.all_cases() if c.name == name)
    c, p = golden_cases.case_params(case.meta, case.params)
    out = flax_nnx.Model(c, p).run_layer(case.meta["layer"], case.meta.get("prefix"), case.inputs)
    return case, c, p, out


def _shares(got, forms: dict[str, np.ndarray]) -> str:
    return ", ".join(f"{k} {100 * agreement(got, v):.1f}%" for k, v in forms.items())


def layer_norm_variance(name: str = "layer_add_norm_cancel_float32") -> str:
    """``nnx.LayerNorm`` (Flax's default ``use_fast_variance=True``) on rows whose mean is thousands of times their
    spread, against fp32 (x - mean) * rsqrt(var + eps) * scale + bias with the one-pass variance
    E[x^2] - E[x]^2 and with the two-pass E[(x - mean)^2]."""
    case, c, p, out = _run(name)
    g, b = (_f32(p[f"{case.meta['prefix']}.{n}"]) for n in ("scale", "bias"))
    x = _f32(_f32(case.inputs["x"]) + _f32(case.inputs["y"]))
    if "bfloat16" in name:
        x = _f32(_bf16(x))
    m = x.mean(-1, keepdims=True, dtype=np.float32)
    one = np.maximum((x * x).mean(-1, keepdims=True, dtype=np.float32) - m * m, 0)
    two = ((x - m) ** 2).mean(-1, keepdims=True, dtype=np.float32)
    forms = {k: (x - m) * ((1 / np.sqrt(v + np.float32(c.layer_norm_eps))).astype(np.float32) * g) + b
             for k, v in (("one-pass variance", one), ("two-pass variance", two))}
    if "bfloat16" in name:
        forms = {k: _bf16(v) for k, v in forms.items()}
    exact = _exact_layer_norm(x, g, b, c.layer_norm_eps)
    dt, pdt = jnp.dtype(c.dtype), jnp.dtype(c.param_dtype)
    slow = nnx.LayerNorm(c.d_model, epsilon=c.layer_norm_eps, use_fast_variance=False, dtype=dt, param_dtype=pdt,
                         rngs=nnx.Rngs(0))
    slow.scale[...], slow.bias[...] = jnp.asarray(g, pdt), jnp.asarray(b, pdt)
    errs = {k: float(np.abs(_f32(v) - exact).max()) for k, v in (
        ("nnx.LayerNorm", out["out"]), ("nnx.LayerNorm(use_fast_variance=False)", slow(jnp.asarray(x, dt))),
        *forms.items())}
    return (f"nnx.LayerNorm ({name}): bit-identical to the fp32 form with the " + _shares(out["out"], forms)
            + "; largest |error| against float64: " + ", ".join(f"{k} {v:.3g}" for k, v in errs.items()))


def _exact_layer_norm(x, g, b, eps) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps) * g + b


def linear_bias_rounding(name: str = "layer_feed_forward_bfloat16") -> str:
    """bf16 ``nnx.Linear``: ``x W`` rounded to bf16 before its bias is added (two roundings) against ``x W + b``
    rounded once, on the case's first linear layer (its output before the activation)."""
    case, c, p, _ = _run(name)
    pre = case.meta["prefix"]
    x, w, b = (_f32(_bf16(a)) for a in (case.inputs["x"], p[f"{pre}.w_1"], p[f"{pre}.b_1"]))
    pdt = jnp.dtype(c.param_dtype)
    dense = nnx.Linear(c.d_model, c.d_ff, dtype=jnp.bfloat16, param_dtype=pdt, rngs=nnx.Rngs(0))
    dense.kernel[...], dense.bias[...] = (jnp.asarray(a, pdt) for a in (w, b))
    got = flax_nnx.host(dense(jnp.asarray(x, jnp.bfloat16)))
    xw = np.einsum("...d,df->...f", x, w, dtype=np.float32)
    return (f"bf16 nnx.Linear ({name}, w_1): bit-identical to " +
            _shares(got, {"x W + b rounded once": _bf16(xw + b), "x W rounded, then + b rounded": _bf16(
                _f32(_bf16(xw)) + b)}))


def embedding_roundings(name: str = "layer_embedding_bfloat16") -> str:
    """bf16 ``nnx.Embed(ids) * sqrt(D) + PE``: against one rounding of the fp32 sum (the contract) and three (the
    product rounded, the bf16 table, the sum rounded)."""
    case, c, p, out = _run(name)
    ids = case.inputs["ids"]
    E = _f32(_bf16(p["embedding"]))[ids]
    pe = positional_encoding(c.max_len, c.d_model)[:ids.shape[1]].astype(np.float32)
    scale = np.float32(np.sqrt(c.d_model))
    thrice = {f"sqrt(D) {k}, the product and table rounded before the sum":
              _bf16(_f32(_bf16(E * r)) + _f32(_bf16(pe))) for k, r in (("fp32", scale), ("bf16", _f32(_bf16(scale))))}
    return (f"bf16 nnx.Embed * sqrt(D) + PE ({name}): bit-identical to " +
            _shares(out["x"], {"one rounding of the fp32 sum": _bf16(E * scale + pe), **thrice}))


def logits_rounding(name: str = "layer_output_projection_bfloat16") -> str:
    """bf16 ``nnx.Embed.attend``: its logits against h E^T in fp32 (the contract) and that rounded to bf16."""
    case, c, p, out = _run(name)
    h, E = _f32(_bf16(case.inputs["h"])), _f32(_bf16(p["embedding"]))
    fp32 = np.einsum("...d,vd->...v", h, E, dtype=np.float32)
    if c.logits_bias:
        fp32 = fp32 + _f32(p["logits_bias"])
    return (f"bf16 nnx.Embed.attend ({name}): bit-identical to " +
            _shares(out["logits"], {"h E^T in fp32": fp32, "h E^T rounded to bf16": _f32(_bf16(fp32))}))


def attention_roundings() -> str:
    """bf16 ``nnx.dot_product_attention`` (the golden cases' d_k != d_v is not supported: random q, k, v of
    (4, 16, 4, 16), N(0, 1)) against three fp32 forms: the contract's (probabilities rounded to bf16 before P V),
    probabilities kept fp32, and the scores also rounded to bf16 before the softmax."""
    rng = np.random.default_rng(0)
    q, k, v = (_f32(_bf16(rng.standard_normal((4, 16, 4, 16)))) for _ in range(3))
    got = nnx.dot_product_attention(*(jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)))
    s = np.einsum("bthk,bshk->bhts", q, k, dtype=np.float32) * np.float32(0.25)

    def out(scores, round_p):
        e = np.exp(scores - scores.max(-1, keepdims=True))
        pr = (e / e.sum(-1, keepdims=True)).astype(np.float32)
        return _bf16(np.einsum("bhts,bshc->bthc", _f32(_bf16(pr)) if round_p else pr, v, dtype=np.float32))
    return ("bf16 nnx.dot_product_attention (random, d_k = d_v = 16): bit-identical to " +
            _shares(flax_nnx.host(got), {"the contract's (probabilities rounded to bf16)": out(s, True),
                                        "probabilities kept fp32": out(s, False),
                                        "scores and probabilities rounded to bf16": out(_f32(_bf16(s)), True)}))


EXPERIMENTS = (layer_norm_variance, lambda: layer_norm_variance("layer_add_norm_cancel_bfloat16"),
               linear_bias_rounding, embedding_roundings, logits_rounding, attention_roundings)

if __name__ == "__main__":
    for experiment in EXPERIMENTS:
        print("-", experiment())
