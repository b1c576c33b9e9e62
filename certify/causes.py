"""The measured cause of each failure the certification found, by adapter and check name prefix. Each states what
an experiment measured: ``python -m certify.diagnose`` runs them (the torch piece the check ran, on the case's
inputs, beside NumPy variants of the spec's computation that differ in one choice); the dtypes are what torch
returned to the suite."""

from __future__ import annotations

_SDPA = ("F.scaled_dot_product_attention (CPU, bf16) keeps the attention probabilities in fp32 for P V: its output "
         "is bit-identical to the spec's attention with fp32 probabilities on 100% of elements, to the contract's "
         "(probabilities rounded to bf16, rule 4) on 66.9%")
_MASKED = ("a query whose every key is masked gets zeros from F.scaled_dot_product_attention (measured: all 0), "
           "where the contract gives the uniform average of the values (max |out| 0.957 here)")
_LOGITS = ("the tied projection F.linear(h, E) of bf16 operands returns bf16 (measured dtype torch.bfloat16): the "
           "logits are rounded to bf16, where the contract's are fp32")
TORCH = {
    "golden_layer[layer_add_norm_cancel_float32]":
        "torch's CPU nn.LayerNorm takes its statistics in one fp32 pass (Welford): on these rows (mean 1.5e3-1.2e4 "
        "times the spread) its 1/std is off by 6.2e-5 relative (torch.native_layer_norm), the order of a sequential "
        "fp32 Welford's (2.2e-4), where the contract's two-pass fp32 statistics are off by 4.2e-8",
    "golden_layer[layer_output_projection_bfloat16]": _LOGITS,
    "golden_layer[layer_scaled_dot_product_attention_overflow": _MASKED,
    "golden_rounding_points[layer_scaled_dot_product_attention": _SDPA,
    "golden_rounding_points[layer_embedding_bfloat16]":
        "the bf16 module rounds E[ids] * sqrt(D) to bf16 and adds the bf16-rounded positional table: its output is "
        "bit-identical to that three-rounding sum on 100% of elements, to the contract's one rounding of the fp32 "
        "sum (rule 3) on 67.6%",
}
AUTOCAST = {
    **{k: v for k, v in TORCH.items() if "sdpa" in k or "scaled_dot" in k or "output_projection" in k},
    "golden_rounding_points[layer_add_norm": "under CPU autocast nn.LayerNorm runs and returns fp32 (layer_norm is "
        "on autocast's fp32 list; measured dtype float32) and x + y is never rounded: 0% of its outputs equal the "
        "contract's bf16 ones",
    "golden_rounding_points[layer_embedding": "autocast does not touch the embedding lookup, the scaling or the "
        "positional sum: the embedding stays fp32 (measured dtype float32), never rounded to bf16 (0% agreement)",
    "layer_shapes_and_dtypes[layer_add_norm": "under CPU autocast nn.LayerNorm returns float32 (measured), where "
        "the contract's activations between sublayers are bf16: the residual stream stays fp32",
    "layer_shapes_and_dtypes[layer_embedding": "the embedding sum is float32 under autocast (measured), not bf16",
}
_KERAS_MATMUL = ("keras.ops.matmul of bf16 operands (TensorFlow, CPU) rounds more than once per output: on a "
                 "random 64x48 by 48x32 product it is bit-identical to fp32 accumulation rounded once on 51%, its "
                 "RMS error 0.69 bf16 ulps against 0.36 for one rounding (1.84 rounding after every addition)")
KERAS = {
    "golden_layer[layer_add_norm_cancel_float32]":
        "keras LayerNormalization folds the mean into the bias: x * inv + (beta - mean * inv), bit-identical to that "
        "fp32 form on 100% of elements (0% to (x - mean) * inv + beta); where the mean is thousands of times the "
        "spread the two large terms cancel (its variance, keras.ops.moments, is exact here)",
    "golden_layer[layer_feed_forward_bfloat16]": _KERAS_MATMUL,
    "golden_rounding_points[layer_feed_forward_bfloat16]": _KERAS_MATMUL,
    "golden_layer[layer_multi_head_attention_bfloat16]": _KERAS_MATMUL,
    "golden_rounding_points[layer_multi_head_attention_bfloat16]": _KERAS_MATMUL,
}
KERAS_SDPA = ("not isolated: bf16 keras.ops.dot_product_attention (TensorFlow, CPU) is bit-identical to neither "
              "form of the attention, the contract's (probabilities rounded to bf16) nor fp32 probabilities: 38% and "
              "40% of elements (with a common score offset of 144, the shifted case: 1.9% and 1.6%; the overflow "
              "case: 5.0% and 4.7%), so it rounds elsewhere too, as its bf16 matmuls do (feed_forward's cause)")
KERAS |= {"golden_layer[layer_scaled_dot_product_attention": KERAS_SDPA,
          "golden_rounding_points[layer_scaled_dot_product_attention": KERAS_SDPA}
_FP32_LOGITS = ("golden_forward[", "golden_incremental[")  # the share of bf16 values among a bf16 model's logits
TORCH |= dict.fromkeys(_FP32_LOGITS, _LOGITS)
AUTOCAST |= dict.fromkeys(_FP32_LOGITS, "F.linear under CPU autocast returns bf16 (measured dtype torch.bfloat16): "
                          "the logits are rounded to bf16, where the contract's are fp32")
HF = dict.fromkeys(_FP32_LOGITS, "the bf16 model (model.to(torch.bfloat16)) returns bf16 logits (measured dtype "
                   "torch.bfloat16): its lm_head rounds them to bf16, where the contract's are fp32")
CAUSES: dict[str, dict[str, str]] = {"nn_transformer": TORCH, "nn_transformer_autocast": AUTOCAST,
                                     "keras_layers": KERAS, "hf_marian": HF, "hf_gpt2": HF}


def cause_of(adapter: str, check: str) -> str:
    """The measured cause of ``check`` failing for ``adapter``, or a plain "not diagnosed"."""
    return next((cause for prefix, cause in CAUSES.get(adapter, {}).items() if check.startswith(prefix)),
                "not diagnosed")


# flax_nnx: measured by ``python -m certify.diagnose_flax`` (Flax NNX 0.12, JAX on CPU)
_FLAX_LN = ("nnx.LayerNorm's default use_fast_variance=True takes the variance in one fp32 pass, E[x^2] - E[x]^2: "
            "where the mean is thousands of times the spread it cancels; its output is bit-identical to the fp32 "
            "form with that one-pass variance on {one} of elements (two-pass: {two}), its largest error against "
            "float64 {err} as that form's; nnx.LayerNorm(use_fast_variance=False)'s is {err2}, the two-pass form's")
FLAX = {
    "golden_layer[layer_add_norm_cancel_float32]": _FLAX_LN.format(one="29.9%", two="0.2%", err="95.1, the same",
                                                                   err2="3.6e-7"),
    "golden_layer[layer_add_norm_cancel_bfloat16]": _FLAX_LN.format(one="100%", two="0%", err="0.126, the same",
                                                                    err2="0.0147"),
    "golden_rounding_points[layer_add_norm_cancel_bfloat16]": _FLAX_LN.format(one="100%", two="0%",
                                                                              err="0.126, the same", err2="0.0147"),
    "golden_layer[layer_output_projection_bfloat16]":
        "bf16 nnx.Embed.attend returns bf16 logits: bit-identical to h E^T rounded to bf16 on 100% of elements, to "
        "the contract's fp32 h E^T on 0.2%",
    "golden_rounding_points[layer_embedding_bfloat16]":
        "bf16 nnx.Embed's rows times sqrt(D) (a bf16 scalar, as bf16 arithmetic keeps it) plus the bf16 positional "
        "table round three times: bit-identical to that form on 100% of elements, to the contract's one rounding "
        "of the fp32 sum (rule 3) on 67.0%",
    "golden_rounding_points[layer_feed_forward_bfloat16]":
        "bf16 nnx.Linear rounds x W to bf16 before adding its bias, which rounds again: its first layer is "
        "bit-identical to that form on 100% of elements, to the contract's x W + b rounded once on 69.6%",
}
CAUSES["flax_nnx"] = FLAX
