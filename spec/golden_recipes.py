"""The recipes of the layer, forward and incremental golden cases, and the generator of every case.

``generate(root)`` writes every case: the layers alone and the forwards here, the decoding cases
(``spec.golden_search``) and the training cases (``spec.golden_training``); ``check()`` regenerates them in a
temporary folder and names the files that differ from the committed ones. The format: ``spec.golden_cases``.
"""

from __future__ import annotations

import filecmp
import json
import math
import tempfile
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import safetensors.numpy

from spec import golden_lm, golden_norm, golden_search, golden_training
from spec import reference as ref
from spec.config import Config
from spec.golden_cases import GOLDEN_DIR, Writer, checked_part, config, faithful_stats, make_params, random_tokens
from spec.numerics import Numerics, np_dtype
from spec.recording import recording

# A regeneration on another CPU: the float64 values of the committed cases moved by at most 8e-14 of a tensor's
# largest magnitude, and their error statistics by at most 1.5e-8 relative (docs/decisions-ref.md).
FLOAT64_NOISE = 1e-9
META_RTOL, META_ATOL = 1e-6, 1e-12

# ----------------------------------------------------------------- layer cases

def _layer_inputs(layer: str, c: Config, rng: np.random.Generator, variant: str = "") -> dict[str, np.ndarray]:
    act = np_dtype(c.dtype)
    B, S, T, D, H = 2, 7, 5, c.d_model, c.n_heads
    x = lambda *shape, scale=1.0: (scale * rng.standard_normal(shape)).astype(np.float32).astype(act)  # noqa: E731
    key_mask = np.ones((B, 1, 1, S), bool)
    key_mask[1, ..., 4:] = False                           # row 1: keys 4.. are padding
    causal = np.tril(np.ones((T, T), bool))[None, None]    # (1, 1, T, T)
    if layer == "positional_encoding":
        return {}
    if layer == "embedding":
        return {"ids": rng.integers(0, c.vocab_size, (B, S)).astype(np.int64)}
    if layer == "scaled_dot_product_attention":
        # Scores of a few units, so the softmax is neither flat nor one-hot.
        mask = key_mask & np.ones((B, 1, T, S), bool)
        mask[0, 0] &= np.tril(np.ones((T, S), bool), k=1)  # row 0: a causal-style band
        q, k = x(B, T, H, c.d_k, scale=1.0 if variant else 1.5), x(B, S, H, c.d_k, scale=1.0 if variant else 1.5)
        if variant == "shifted":
            # Every score gets a common offset q_0 k_0 = 144. Softmax is shift-invariant, so the exact
            # result keeps its O(1) spread; a bf16 ulp at 144 is 1, so scores rounded to bf16 (against
            # rule 4 of the contract) lose it: measured 3.4x over the max and 5.5x over the RMS allowance.
            q[..., 0], k[..., 0] = 12.0, 12.0
        if variant == "overflow":
            # A common offset q_0 k_0 / sqrt(d_k) = 225 overflows an unshifted fp32 exp (above 88.7) where the
            # max-subtracted softmax of rule 4 is exact; beside it a query whose every key is masked, whose
            # scores are all MASKED_SCORE: uniform weights, where exp(MASKED_SCORE) / sum is 0 / 0.
            q[..., 0], k[..., 0] = 30.0, 30.0
            mask[1, 0, 0] = False
        return {"q": q, "k": k, "v": x(B, S, H, c.d_v), "mask": mask}
    if layer == "multi_head_attention":
        return {"x_q": x(B, T, D), "x_kv": x(B, S, D), "mask": key_mask}
    if layer == "add_norm":
        return golden_norm.add_norm_inputs(act, D, rng, x, variant)
    if layer == "feed_forward":
        return {"x": x(B, S, D)}
    if layer == "encoder_layer":
        return {"x": x(B, S, D), "mask": key_mask}
    if layer == "decoder_layer":
        return {"y": x(B, T, D), "memory": x(B, S, D), "self_mask": np.broadcast_to(causal, (B, 1, T, T)).copy(),
                "memory_mask": key_mask}
    if layer == "output_projection":
        return {"h": x(B, T, D)}
    raise ValueError(layer)


def unit_of_layer_output(layer: str, c: Config) -> str:
    """The dtype whose eps measures a layer's output alone: its contract dtype."""
    from spec.shapes import LAYERS as TABLE
    (dtype,) = {d for _, d in TABLE[layer]["outputs"].values()}
    return c.dtype if dtype == "act" else dtype


LAYER_PREFIX = {
    "positional_encoding": "", "embedding": "", "scaled_dot_product_attention": "",
    "multi_head_attention": "decoder.layers.1.cross_attn", "add_norm": "encoder.layers.0.ffn_norm",
    "feed_forward": "encoder.layers.1.ffn", "encoder_layer": "encoder.layers.1",
    "decoder_layer": "decoder.layers.1", "output_projection": "",
}


def _layer_case(w: Writer, layer: str, dtype: str, variant: str = "") -> None:
    name = f"layer_{layer}_{variant + '_' if variant else ''}{dtype}"
    c, seed = config("tiny", dtype), 11
    params = make_params(c, seed)
    inputs = _layer_inputs(layer, c, np.random.default_rng(zlib.crc32(name.encode())), variant)
    P = ref.as_float64(params, c)
    I = {k: v if v.dtype.kind in "bi" else v.astype(np.float64) for k, v in inputs.items()}  # ids, masks as they are
    exact = ref.run_layer(layer, P, LAYER_PREFIX[layer], I, c, Numerics("exact"))
    faithful = ref.run_layer(layer, P, LAYER_PREFIX[layer], I, c, Numerics(c.dtype))
    meta = {"kind": "layer", "layer": layer, "prefix": LAYER_PREFIX[layer],
            "tensors": faithful_stats(exact, faithful, c, {}, {}, unit=unit_of_layer_output(layer, c))}
    meta.update(golden_norm.description(layer, variant, dtype))  # what the inputs show: the cancellation cases'
    rounded = unit_of_layer_output(layer, c) == "bfloat16"  # a bf16 rounding point (a bf16 config's activation)
    stored = {k: v.astype(ml_dtypes.bfloat16) for k, v in faithful.items()} if rounded else None  # exact casts
    w.write(name, meta, inputs, exact, c, params, seed, faithful=stored)


# ----------------------------------------------------------------- forward cases

def _forward_case(w: Writer, name: str, cfg: str, dtype: str, seed: int, src_lens: list[int], S: int,
                  tgt_lens: list[int], T: int, *, sample: int | None = None, layer_outputs_only: bool = False,
                  causal_pair: bool = False, incremental: bool = False, param_dtype: str | None = None) -> None:
    """A teacher-forced forward (or, with ``incremental``, its per-step logits). ``sample`` = n stores n
    feature columns spread evenly over each tensor's last axis, plus whole logit rows at the first and last
    non-pad target position of each sequence (``checked_part``)."""
    c = config(cfg, dtype).replace(param_dtype=param_dtype or dtype)
    params = make_params(c, seed)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    src, tgt_in = random_tokens(rng, c, src_lens, S, False), random_tokens(rng, c, tgt_lens, T, True)
    if causal_pair:  # two rows, same source and target prefix, different suffixes
        src[1], tgt_in[1, :T // 2] = src[0], tgt_in[0, :T // 2]
    P = ref.as_float64(params, c)
    with recording() as exact:
        ref.forward(P, src, tgt_in, c, Numerics("exact"))
    with recording() as faithful:
        ref.forward(P, src, tgt_in, c, Numerics(c.dtype))
    if incremental:
        exact = {"step_logits": exact["logits"]}
        faithful = {"step_logits": _incremental_logits(P, src, tgt_in, c, Numerics(c.dtype))}
    elif layer_outputs_only:
        keep = ("src_embed", "tgt_embed", "encoder.out", "decoder.out", "logits")
        exact = {k: v for k, v in exact.items() if k in keep or k.endswith(".out")}
    sampling, names = {}, list(exact)
    if sample is not None:
        sampling = {"columns": sample, "rows": [[b, t] for b, n in enumerate(tgt_lens) for t in (0, n - 1)]}
        names.append("logits@rows")
    stored = {k: checked_part(k, exact, sampling) for k in names}
    meta = {"kind": "incremental" if incremental else "forward", "sampling": sampling,
            "tensors": faithful_stats(exact, faithful, c, {"src": src, "tgt": tgt_in}, sampling, names)}
    w.write(name, meta, {"src": src, "tgt_in": tgt_in}, stored, c, params, seed)


def _incremental_logits(P: ref.Params, src: np.ndarray, tgt_in: np.ndarray, c: Config, nx: Numerics) -> np.ndarray:
    model = ref.Transformer(P, c, nx)
    cache = model.init_cache(model.encode(src), src, tgt_in.shape[1])
    steps = []
    for t in range(tgt_in.shape[1]):
        logits, cache = model.decode(tgt_in[:, t:t + 1], cache)
        steps.append(logits)
    return np.concatenate(steps, axis=1)


# ----------------------------------------------------------------- all cases

LAYERS = ("positional_encoding", "embedding", "scaled_dot_product_attention", "multi_head_attention", "add_norm",
          "feed_forward", "encoder_layer", "decoder_layer", "output_projection")


def generate(root: Path) -> None:
    """Write every golden case under ``root``."""
    w = Writer(root)
    _layer_case(w, "positional_encoding", "float32")  # an fp32 table in either mode
    for dtype in ("bfloat16", "float32"):
        for layer in LAYERS[1:]:
            _layer_case(w, layer, dtype)
    _layer_case(w, "scaled_dot_product_attention", "bfloat16", variant="shifted")
    _layer_case(w, "scaled_dot_product_attention", "bfloat16", variant="overflow")
    _layer_case(w, "add_norm", "bfloat16", variant="large_mean")
    for dtype in ("bfloat16", "float32"):
        _layer_case(w, "add_norm", dtype, variant="cancel")
    _forward_case(w, "forward_tiny_bfloat16", "tiny", "bfloat16", 1, [9, 9], 9, [7, 7], 7)
    _forward_case(w, "forward_tiny_float32", "tiny", "float32", 1, [9, 9], 9, [7, 7], 7)
    _forward_case(w, "forward_tiny_prenorm_bfloat16", "tiny_prenorm", "bfloat16", 2, [8, 8], 8, [6, 6], 6)
    for dtype in ("bfloat16", "float32"):
        _forward_case(w, f"forward_small_{dtype}", "small", dtype, 3, [10, 10], 10, [8, 8], 8, layer_outputs_only=True)
    _forward_case(w, "forward_padded_bfloat16", "tiny", "bfloat16", 4, [11, 5, 8], 11, [9, 3, 6], 9)
    _forward_case(w, "forward_causal_bfloat16", "tiny", "bfloat16", 5, [6, 6], 6, [8, 8], 8, causal_pair=True)
    _forward_case(w, "forward_base_bfloat16", "base", "bfloat16", 6, [6, 4], 6, [5, 4], 5, sample=128)
    for dtype, param_dtype in (("bfloat16", "float32"), ("float32", "bfloat16")):
        _forward_case(w, f"forward_tiny_{dtype}_params_{param_dtype}", "tiny", dtype, 8, [9, 6], 9, [7, 5], 7,
                      param_dtype=param_dtype)
    _forward_case(w, "incremental_tiny_bfloat16", "tiny", "bfloat16", 7, [8, 5], 8, [7, 4], 7, incremental=True)
    _forward_case(w, "forward_tiny_marian_bfloat16", "tiny_marian", "bfloat16", 40, [9, 6], 9, [7, 5], 7)
    _forward_case(w, "forward_tiny_gelu_float32", "tiny_gelu", "float32", 41, [9, 6], 9, [7, 5], 7)
    _forward_case(w, "incremental_tiny_gelu_bfloat16", "tiny_gelu", "bfloat16", 42, [8, 5], 8, [7, 4], 7,
                  incremental=True)
    for dtype in ("bfloat16", "float32"):  # tiny_marian's options in the shapes MarianMTModel can hold
        _forward_case(w, f"forward_tiny_marian_hf_{dtype}", "tiny_marian_hf", dtype, 45, [9, 6], 9, [7, 5], 7)
        _forward_case(w, f"incremental_tiny_marian_hf_{dtype}", "tiny_marian_hf", dtype, 46, [8, 5], 8, [7, 4], 7,
                      incremental=True)
    for d in golden_search.DECODING_CASES:
        golden_search.decode_case(w, d)
    golden_lm.generate(w)
    golden_training.generate(w)


def check(root: Path = GOLDEN_DIR) -> list[str]:
    """Regenerate into a temporary folder; the names of files that differ from ``root`` beyond float64 noise.

    Regenerated on another CPU, the float64 values move in their last bits (other BLAS and SIMD kernels), so a file
    whose bytes differ passes when it is the same up to that noise (``same_up_to_noise``); on the CPU that wrote
    the committed files they are the same bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        new = sorted(p.relative_to(tmp).as_posix() for p in Path(tmp).rglob("*") if p.is_file())
        old = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
        differ = sorted(set(new) ^ set(old))
        differ += [f for f in set(new) & set(old) if not filecmp.cmp(Path(tmp) / f, root / f, shallow=False)
                   and not same_up_to_noise(Path(tmp) / f, root / f)]
        return sorted(differ)


def same_up_to_noise(new: Path, old: Path) -> bool:
    """Whether two versions of a case file agree but for float64 noise: safetensors with the same names, dtypes
    and shapes, integer and bool tensors equal, float ones within ``FLOAT64_NOISE`` of the tensor's largest
    magnitude; JSON with the same structure, strings and integers equal, floats within ``META_RTOL`` (and
    ``META_ATOL``), the files' digests aside (they follow the bytes)."""
    if new.suffix == ".json":
        a, b = (json.loads(p.read_text()) for p in (new, old))
        return _close_json({k: v for k, v in a.items() if k != "sha256"}, {k: v for k, v in b.items() if k != "sha256"})
    if new.suffix != ".safetensors":
        return False
    a, b = safetensors.numpy.load_file(str(new)), safetensors.numpy.load_file(str(old))
    return sorted(a) == sorted(b) and all(close_up_to_noise(a[k], b[k]) for k in a)


def close_up_to_noise(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether tensor ``a`` is ``b`` but for float64 noise: the same dtype and shape; integers and bools equal;
    floats within ``FLOAT64_NOISE`` of ``b``'s largest magnitude, NaN where ``b`` has NaN."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not np.issubdtype(a.dtype, np.floating) and a.dtype != ml_dtypes.bfloat16:
        return bool(np.array_equal(a, b))
    x, y = a.astype(np.float64), b.astype(np.float64)
    bound = FLOAT64_NOISE * float(np.max(np.abs(y), initial=0.0, where=~np.isnan(y)))
    return bool(np.array_equal(np.isnan(x), np.isnan(y)) and np.all(np.abs(np.nan_to_num(x - y)) <= bound))


def _close_json(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return sorted(a) == sorted(b) and all(_close_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, int | float) and isinstance(b, int | float) and math.isclose(
            a, b, rel_tol=META_RTOL, abs_tol=META_ATOL)
    return a == b
