"""The experiments behind the measured causes in ``certify.causes``: each runs the torch piece a failing check
ran, on that golden case's inputs, beside NumPy variants of the spec's computation that differ in one choice, and
prints how closely torch matches each (the share of elements bit-identical, or the statistic torch keeps)::

    python -m certify.diagnose
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch
import torch.nn.functional as F

from conformance import golden as G
from spec import golden_cases
from spec.agreement import agreement
from spec.reference.layers import positional_encoding

BF16 = ml_dtypes.bfloat16


def _case(name: str) -> G.Case:
    return next(c for c in G.all_cases() if c.name == name)


def _bf16(x) -> np.ndarray:
    return np.asarray(x, np.float32).astype(BF16)


def layer_norm_statistics() -> str:
    """fp32 ``nn.LayerNorm`` on rows whose mean is thousands of times their spread: torch's 1/std (from
    ``torch.native_layer_norm``) against the exact one, and the fp32 two-pass, one-pass E[x^2] - E[x]^2 and
    Welford ones."""
    case = _case("layer_add_norm_cancel_float32")
    x = (case.inputs["x"].astype(np.float32) + case.inputs["y"].astype(np.float32))
    eps = case.config.layer_norm_eps
    _, _, rstd = torch.native_layer_norm(torch.from_numpy(x), (x.shape[-1],), None, None, eps)
    x64 = x.astype(np.float64)
    exact = 1 / np.sqrt(x64.var(-1) + eps)
    m = x.mean(-1, dtype=np.float32)
    two_pass = 1 / np.sqrt(((x - m[..., None]) ** 2).mean(-1, dtype=np.float32) + np.float32(eps))
    one_pass = 1 / np.sqrt(np.maximum((x * x).mean(-1, dtype=np.float32) - m * m, 0) + np.float32(eps))
    rel = {k: float(np.max(np.abs(v.astype(np.float64) / exact - 1))) for k, v in
           (("torch", rstd.numpy().reshape(exact.shape)), ("two-pass fp32", two_pass), ("one-pass fp32", one_pass),
            ("Welford fp32", _welford_rstd(x, eps)))}
    return ("fp32 nn.LayerNorm, rows of mean 1.5e3-1.2e4 x their spread (layer_add_norm_cancel_float32): "
            "1/std's largest relative error: " + ", ".join(f"{k} {v:.2g}" for k, v in rel.items()))


def _welford_rstd(x: np.ndarray, eps: float) -> np.ndarray:
    """1/std of each row of x (..., D) by Welford's running mean and M2, one element at a time, in fp32."""
    mean, m2 = np.zeros(x.shape[:-1], np.float32), np.zeros(x.shape[:-1], np.float32)
    for n in range(x.shape[-1]):
        delta = x[..., n] - mean
        mean = mean + delta / np.float32(n + 1)
        m2 = m2 + delta * (x[..., n] - mean)
    return 1 / np.sqrt(m2 / np.float32(x.shape[-1]) + np.float32(eps))


def _attention_variants(q, k, v, mask):
    """The spec's bf16 attention (probabilities rounded to bf16 before P V) and the variant keeping them fp32,
    each (B, T, H, C) bf16."""
    q32, k32, v32 = (np.asarray(a, np.float32) for a in (q, k, v))
    s = np.einsum("bthk,bshk->bhts", q32, k32, dtype=np.float32) * np.float32(1 / np.sqrt(q.shape[-1]))
    s = np.where(mask, s, np.finfo(np.float32).min)
    e = np.exp(s - s.max(-1, keepdims=True))
    p = (e / e.sum(-1, keepdims=True)).astype(np.float32)
    out = {name: _bf16(np.einsum("bhts,bshc->bthc", pp, v32, dtype=np.float32))
           for name, pp in (("probabilities rounded to bf16", _bf16(p).astype(np.float32)),
                            ("probabilities kept fp32", p))}
    return out


def sdpa_probabilities(name: str = "layer_scaled_dot_product_attention_bfloat16") -> str:
    """bf16 ``F.scaled_dot_product_attention`` on CPU against the two NumPy variants: the share of output elements
    bit-identical to each."""
    i = _case(name).inputs
    t = [torch.from_numpy(np.asarray(i[n], np.float32)).to(torch.bfloat16).transpose(1, 2) for n in "qkv"]
    got = F.scaled_dot_product_attention(*t, attn_mask=torch.from_numpy(i["mask"])).transpose(1, 2)
    got = got.float().numpy()
    shares = {k: agreement(got, v) for k, v in _attention_variants(i["q"], i["k"], i["v"], i["mask"]).items()}
    return (f"bf16 F.scaled_dot_product_attention on CPU ({name}): bit-identical to the spec's attention with "
            + ", ".join(f"{k}: {100 * v:.1f}%" for k, v in shares.items()))


def sdpa_masked_row() -> str:
    """A query whose every key is masked (the overflow case's batch 1, query 0): torch's output there against the
    spec's uniform average of the values."""
    i = _case("layer_scaled_dot_product_attention_overflow_bfloat16").inputs
    t = [torch.from_numpy(np.asarray(i[n], np.float32)).to(torch.bfloat16).transpose(1, 2) for n in "qkv"]
    got = F.scaled_dot_product_attention(*t, attn_mask=torch.from_numpy(i["mask"])).transpose(1, 2)[1, 0].float()
    uniform = np.asarray(i["v"][1], np.float32).mean(0)                           # (H, C)
    return (f"bf16 F.scaled_dot_product_attention on CPU, a query with every key masked: torch gives max |out| "
            f"{float(got.abs().max()):.3g} (all zeros: {bool((got == 0).all())}); the spec's uniform average has "
            f"max |out| {float(np.abs(uniform).max()):.3g}")


def embedding_roundings() -> str:
    """The bf16 module's embedding ``E[ids] * sqrt(D) + PE`` against one rounding (the spec) and three (the
    product rounded, the bf16 table, the sum rounded)."""
    case = _case("layer_embedding_bfloat16")
    c, p = golden_cases.case_params(case.meta, case.params)
    ids = case.inputs["ids"]
    E = np.asarray(p["embedding"], np.float32)[ids]
    pe = positional_encoding(c.max_len, c.d_model)[:ids.shape[1]].astype(np.float32)
    scale = np.float32(np.sqrt(c.d_model))
    got = (torch.from_numpy(E).to(torch.bfloat16) * float(np.sqrt(c.d_model))
           + torch.from_numpy(pe).to(torch.bfloat16)).float().numpy()
    once = _bf16(E * scale + pe)
    thrice = _bf16(_bf16(E * scale).astype(np.float32) + _bf16(pe).astype(np.float32))
    return (f"bf16 module's embedding (layer_embedding_bfloat16): bit-identical to one rounding of the fp32 sum "
            f"(the spec) {100 * agreement(got, once):.1f}%, to the product and the table rounded to bf16 before "
            f"the sum {100 * agreement(got, thrice):.1f}%")


def logits_dtype() -> str:
    """The bf16 module's tied projection ``F.linear(h, E)``: the dtype torch returns."""
    h = torch.randn(2, 3, 32, dtype=torch.bfloat16)
    return f"F.linear of bf16 h and a bf16 table returns {F.linear(h, torch.randn(61, 32).bfloat16()).dtype}"


def hf_logits_dtype() -> str:
    """The dtype of the logits a bf16 ``MarianMTModel``, ``GPT2LMHeadModel`` (the golden cases in their shapes, cast
    with ``model.to``) and ``F.linear`` under CPU autocast return."""
    import tempfile
    from pathlib import Path

    import transformers

    from certify.adapters import hf_common
    from spec.convert import gpt2, marian
    from spec.weights_io import save_weights
    got = {}
    for name, convert, cls, cfg, kind in (
            ("forward_tiny_marian_hf_bfloat16", marian, transformers.MarianMTModel, transformers.MarianConfig,
             "encoder_decoder"),
            ("lm_forward_tiny_gpt2_hf_bfloat16", gpt2, transformers.GPT2LMHeadModel, transformers.GPT2Config,
             "decoder_only")):
        case = _case(name)
        path = Path(tempfile.mkdtemp()) / "w.safetensors"
        save_weights(path, *golden_cases.case_params(case.meta, case.params))
        _, model = hf_common.build(path, convert, cls, cfg, kind, cls.__name__)
        ids = torch.ones(1, 4, dtype=torch.long)
        args = {"input_ids": ids, "decoder_input_ids": ids} if kind == "encoder_decoder" else {"input_ids": ids}
        with torch.no_grad():
            got[cls.__name__] = model(**args).logits.dtype
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got["F.linear under autocast"] = F.linear(torch.randn(2, 32), torch.randn(61, 32)).dtype
    return "logits dtype: " + ", ".join(f"{k} {v}" for k, v in got.items())


def keras_layer_norm_fold() -> str:
    """fp32 ``keras.layers.LayerNormalization`` on the cancelling rows against two fp32 forms of the same
    statistics: ``(x - mean) * inv + beta`` and the folded ``x * inv + (beta - mean * inv)``."""
    import keras
    case = _case("layer_add_norm_cancel_float32")
    c, p = golden_cases.case_params(case.meta, case.params)
    g, b = (np.asarray(p[f"{case.meta['prefix']}.{n}"], np.float32) for n in ("scale", "bias"))
    x = case.inputs["x"].astype(np.float32) + case.inputs["y"].astype(np.float32)
    norm = keras.layers.LayerNormalization(epsilon=c.layer_norm_eps)
    norm.build((None, c.d_model))
    norm.set_weights([g, b])
    got = np.asarray(keras.ops.convert_to_numpy(norm(x)))
    m = x.mean(-1, keepdims=True, dtype=np.float32)
    inv = (1 / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True, dtype=np.float32) + np.float32(c.layer_norm_eps))) * g
    return (f"fp32 keras LayerNormalization (layer_add_norm_cancel_float32): bit-identical to the folded "
            f"x * inv + (beta - mean * inv) on {100 * agreement(got, x * inv + (b - m * inv)):.1f}%, to "
            f"(x - mean) * inv + beta on {100 * agreement(got, (x - m) * inv + b):.1f}%")


def keras_bf16_matmul() -> str:
    """``keras.ops.matmul`` of bf16 operands (64 x 48 by 48 x 32, N(0, 1)) against fp32 accumulation rounded once
    and against rounding after every addition: agreement and RMS error in bf16 ulps at the exact result's scale."""
    import keras
    rng = np.random.default_rng(0)
    a, b = _bf16(rng.standard_normal((64, 48))), _bf16(rng.standard_normal((48, 32)))
    got = keras.ops.matmul(*(keras.ops.cast(np.asarray(t, np.float32), "bfloat16") for t in (a, b)))
    got = np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(got, "float32")))
    exact = a.astype(np.float64) @ b.astype(np.float64)
    once = _bf16(a.astype(np.float32) @ b.astype(np.float32)).astype(np.float32)
    every = np.zeros(exact.shape, np.float32)
    for k in range(a.shape[1]):
        every = _bf16(every + a[:, k:k + 1].astype(np.float32) * b[k:k + 1].astype(np.float32)).astype(np.float32)
    ulp = 2.0 ** np.floor(np.log2(np.sqrt((exact ** 2).mean()))) * 2.0 ** -7
    rms = {k: float(np.sqrt((((v - exact) / ulp) ** 2).mean())) for k, v in
           (("keras", got), ("one rounding", once), ("a rounding per addition", every))}
    return (f"keras.ops.matmul of bf16 on {keras.backend.backend()} CPU: bit-identical to fp32 accumulation rounded "
            f"once on {100 * agreement(got, once):.0f}%; RMS error in bf16 ulps: "
            + ", ".join(f"{k} {v:.2f}" for k, v in rms.items()))


def keras_sdpa(name: str = "layer_scaled_dot_product_attention_bfloat16") -> str:
    """bf16 ``keras.ops.dot_product_attention`` against the two NumPy forms of ``_attention_variants``."""
    import keras
    i = _case(name).inputs
    t = [keras.ops.cast(np.asarray(i[n], np.float32), "bfloat16") for n in "qkv"]
    got = keras.ops.cast(keras.ops.dot_product_attention(*t, mask=i["mask"]), "float32")
    got = np.asarray(keras.ops.convert_to_numpy(got))
    shares = {k: agreement(got, v) for k, v in _attention_variants(i["q"], i["k"], i["v"], i["mask"]).items()}
    return (f"bf16 keras.ops.dot_product_attention ({name}): bit-identical to the spec's attention with "
            + ", ".join(f"{k}: {100 * v:.1f}%" for k, v in shares.items()))


EXPERIMENTS = (layer_norm_statistics, sdpa_probabilities, sdpa_masked_row, embedding_roundings, logits_dtype,
               hf_logits_dtype,
               keras_layer_norm_fold, keras_bf16_matmul, keras_sdpa,
               lambda: keras_sdpa("layer_scaled_dot_product_attention_shifted_bfloat16"))

if __name__ == "__main__":
    torch.set_num_threads(1)
    for experiment in EXPERIMENTS:
        print("-", experiment())
