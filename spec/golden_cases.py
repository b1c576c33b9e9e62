"""Golden test vectors: their definitions, generator and bit-for-bit check.

    python -m spec.golden_cases            # (re)write spec/golden/
    python -m spec.golden_cases --check    # regenerate in a temp dir, compare with the committed files

One folder per case, in the style of the ONNX backend tests:

    meta.json               case, kind, config, generator version, tolerance policy, how to make
                            the weights, the faithful reference's error per tensor, sha256 of each file
    inputs.safetensors      the inputs, in their contract dtypes
    expected.safetensors    the float64 ("exact") value of every checked tensor, or the tokens

Kinds: "layer" (one layer alone), "forward" (all intermediates of a
teacher-forced forward), "incremental" (per-step logits with the KV cache),
"greedy" and "beam" (output tokens).

Weights are not stored: ``case_params(meta)`` regenerates them from the seed
(``init_params(..., observable=True)``, so every bias and LayerNorm scale is
visible) and checks them against the sha256 recorded in ``meta["params"]``.
That keeps the committed files small and makes the init part of what
``--check`` verifies.

Each checked tensor's errors are measured in units of the eps of
``meta["tensors"][name]["unit"]``: the config's dtype, except a layer alone
whose contract output is fp32 (positional encoding, logits), measured in fp32
eps so that a backend rounding it to bf16 fails.
"""

from __future__ import annotations

import argparse
import filecmp
import hashlib
import json
import shutil
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np
import safetensors.numpy

from spec import reference as ref
from spec import search, tolerance
from spec.config import BASE, TINY, Config
from spec.init import init_params
from spec.numerics import Numerics, np_dtype

GENERATOR_VERSION = "1"
GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
# A multi-layer config distinct from tiny: d_k = d_v, three layers per stack.
SMALL = Config(vocab_size=97, d_model=64, n_heads=4, d_k=16, d_v=16, d_ff=128,
               n_encoder_layers=3, n_decoder_layers=3, max_len=64, dropout=0.1)
CONFIGS = {"tiny": TINY, "tiny_prenorm": TINY.replace(norm_first=True), "small": SMALL, "base": BASE}
EOS_BOOST = 2.0  # decoding cases scale E[eos] (by a power of two, exact) so that some hypotheses end


def config(name: str, dtype: str) -> Config:
    return CONFIGS[name].replace(dtype=dtype, param_dtype=dtype)


def positions_of(tensor: str) -> str | None:
    """Which token positions index axis 1 of a recorded tensor: "src", "tgt" or None."""
    if tensor.startswith(("src_embed", "encoder.")):
        return "src"
    if tensor.startswith(("tgt_embed", "decoder.", "logits", "step_logits")):
        return "tgt"
    return None


def valid_rows(x: np.ndarray, ids: np.ndarray | None, pad_id: int) -> np.ndarray:
    """The rows of ``x`` (B, L, ...) at non-pad positions of ``ids`` (B, L): outputs at
    padding positions are unspecified (``spec.numerics`` rule 4)."""
    return x if ids is None else x[ids != pad_id]


def _tokens(rng: np.random.Generator, c: Config, lengths: list[int], L: int, bos: bool) -> np.ndarray:
    ids = rng.integers(3, c.vocab_size, (len(lengths), L)).astype(np.int64)
    if bos:
        ids[:, 0] = c.bos_id
    for b, n in enumerate(lengths):
        ids[b, n:] = c.pad_id
    return ids


class _Writer:
    def __init__(self, root: Path):
        self.root = root

    def write(self, name: str, meta: dict, inputs: dict, expected: dict, c: Config, params: dict,
              seed: int, eos_boost: float | None = None) -> None:
        d = self.root / name
        d.mkdir(parents=True, exist_ok=True)
        files = {"inputs.safetensors": inputs, "expected.safetensors": expected}
        for fname, tensors in files.items():
            safetensors.numpy.save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(d / fname))
        meta = {"case": name, "generator_version": GENERATOR_VERSION, "config": c.to_dict(),
                "params": {"seed": seed, "observable": True, "eos_boost": eos_boost, "sha256": params_digest(params)},
                "tolerance_policy": {"max_ratio": tolerance.MAX_RATIO, "rms_ratio": tolerance.RMS_RATIO,
                                     "floor_eps": tolerance.FLOOR_EPS},
                **meta}
        meta["sha256"] = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.glob("*.safetensors"))}
        (d / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


def params_digest(params: dict[str, np.ndarray]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in schema order."""
    h = hashlib.sha256()
    for name, a in params.items():
        h.update(f"{name}|{a.dtype}|{a.shape}|".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def make_params(c: Config, seed: int, eos_boost: float | None = None) -> dict[str, np.ndarray]:
    """Golden-case weights: observable init, and E[eos] scaled for decoding cases."""
    params = init_params(c, seed, observable=True)
    if eos_boost is not None:
        params["embedding"][c.eos_id] *= eos_boost
    return params


def case_params(meta: dict) -> tuple[Config, dict[str, np.ndarray]]:
    """The config and weights of a golden case, regenerated and checked against ``meta``.

    Raises:
        ValueError: if the regenerated weights' sha256 differs from the recorded one.
    """
    c = Config.from_dict(meta["config"])
    p = meta["params"]
    params = make_params(c, p["seed"], p["eos_boost"])
    if params_digest(params) != p["sha256"]:
        raise ValueError(f"golden case {meta['case']}: regenerated weights differ from the recorded sha256")
    return c, params


def _faithful_stats(exact: dict, faithful: dict, c: Config, ids: dict, slices: dict,
                    unit: str | None = None) -> dict:
    out = {}
    for name, x in exact.items():
        pos = positions_of(name)
        sl = slices.get(name)
        xs = x if sl is None else x[..., :sl]
        fs = faithful[name] if sl is None else faithful[name][..., :sl]
        pid = ids.get(pos)
        out[name] = tolerance.error_stats(valid_rows(fs, pid, c.pad_id), valid_rows(xs, pid, c.pad_id),
                                          unit or c.dtype).to_dict()
    return out


# ----------------------------------------------------------------- layer cases

def _layer_inputs(layer: str, c: Config, rng: np.random.Generator, shifted: bool = False) -> dict[str, np.ndarray]:
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
        q, k = x(B, T, H, c.d_k, scale=1.0 if shifted else 1.5), x(B, S, H, c.d_k, scale=1.0 if shifted else 1.5)
        if shifted:
            # Every score gets a common offset q_0 k_0 = 144. Softmax is shift-invariant, so the exact
            # result keeps its O(1) spread; a bf16 ulp at 144 is 1, so scores rounded to bf16 (against
            # rule 4 of the contract) lose it: measured 3.4x over the max and 5.5x over the RMS allowance.
            q[..., 0], k[..., 0] = 12.0, 12.0
        return {"q": q, "k": k, "v": x(B, S, H, c.d_v), "mask": mask}
    if layer == "multi_head_attention":
        return {"x_q": x(B, T, D), "x_kv": x(B, S, D), "mask": key_mask}
    if layer == "add_norm":
        # Variance ~1e-6, comparable to layer_norm_eps: the eps is observable.
        return {"x": x(B, S, D, scale=1e-3), "y": x(B, S, D, scale=1e-3)}
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


def _layer_case(w: _Writer, layer: str, dtype: str, shifted: bool = False) -> None:
    name = f"layer_{layer}_{'shifted_' if shifted else ''}{dtype}"
    c, seed = config("tiny", dtype), 11
    params = make_params(c, seed)
    inputs = _layer_inputs(layer, c, np.random.default_rng(zlib.crc32(name.encode())), shifted)
    P = ref.as_float64(params, c)
    I = {k: v if v.dtype.kind in "bi" else v.astype(np.float64) for k, v in inputs.items()}  # ids, masks as they are
    exact = ref.run_layer(layer, P, LAYER_PREFIX[layer], I, c, Numerics("exact"))
    faithful = ref.run_layer(layer, P, LAYER_PREFIX[layer], I, c, Numerics(c.dtype))
    meta = {"kind": "layer", "layer": layer, "prefix": LAYER_PREFIX[layer],
            "tensors": _faithful_stats(exact, faithful, c, {}, {}, unit_of_layer_output(layer, c))}
    w.write(name, meta, inputs, exact, c, params, seed)


# ----------------------------------------------------------------- forward cases

def _forward_case(w: _Writer, name: str, cfg: str, dtype: str, seed: int, src_lens: list[int], S: int,
                  tgt_lens: list[int], T: int, *, slice_last: int | None = None, layer_outputs_only: bool = False,
                  causal_pair: bool = False, incremental: bool = False) -> None:
    c = config(cfg, dtype)
    params = make_params(c, seed)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    src, tgt_in = _tokens(rng, c, src_lens, S, False), _tokens(rng, c, tgt_lens, T, True)
    if causal_pair:  # two rows, same source and target prefix, different suffixes
        src[1], tgt_in[1, :T // 2] = src[0], tgt_in[0, :T // 2]
    P = ref.as_float64(params, c)
    exact, faithful = {}, {}
    ref.forward(P, src, tgt_in, c, Numerics("exact"), exact)
    ref.forward(P, src, tgt_in, c, Numerics(c.dtype), faithful)
    if incremental:
        exact = {"step_logits": exact["logits"]}
        faithful = {"step_logits": _incremental_logits(P, src, tgt_in, c, Numerics(c.dtype))}
    elif layer_outputs_only:
        keep = ("src_embed", "tgt_embed", "encoder.out", "decoder.out", "logits")
        exact = {k: v for k, v in exact.items() if k in keep or k.endswith(".out")}
    slices = {} if slice_last is None else {k: slice_last for k in exact}
    stored = {k: (v if slice_last is None else v[..., :slice_last]) for k, v in exact.items()}
    meta = {"kind": "incremental" if incremental else "forward",
            "slices": slices, "tensors": _faithful_stats(exact, faithful, c, {"src": src, "tgt": tgt_in}, slices)}
    w.write(name, meta, {"src": src, "tgt_in": tgt_in}, stored, c, params, seed)


def _incremental_logits(P: ref.Params, src: np.ndarray, tgt_in: np.ndarray, c: Config, nx: Numerics) -> np.ndarray:
    cache = ref.init_cache(P, ref.encode(P, src, c, nx), src, c, nx)
    return np.concatenate([ref.decode(P, tgt_in[:, t:t + 1], cache, c, nx) for t in range(tgt_in.shape[1])], axis=1)


# ----------------------------------------------------------------- decoding cases

def _decode_case(w: _Writer, name: str, kind: str, dtype: str, src_lens: list[int], S: int,
                 beam_size: int = 4, alpha: float = 0.6) -> None:
    """Search seeds (deterministically) for weights whose decisions all have a safe margin,
    where exact and faithful decoding agree, and one sequence ends at EOS and another at its limit.

    Beam search over a random bf16 model has, at some step, two candidates
    closer than bf16 logits can resolve (measured: margins 1e-4..2e-2 against
    ~0.17 required), so two conformant bf16 backends may legitimately choose
    differently: the exact-match beam case is fp32, where the required margin
    is ~1e-5. (The conformance suite checks bf16 beam search by self-consistency.)"""
    c = config("tiny", dtype)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    for seed in range(100, 400):
        params = make_params(c, seed, EOS_BOOST)
        src = _tokens(rng, c, src_lens, S, False)
        P = ref.as_float64(params, c)
        trace_x, trace_f = {}, {}
        out = _run_search(kind, P, src, c, Numerics("exact"), trace_x, beam_size, alpha)
        again = _run_search(kind, P, src, c, Numerics(c.dtype), trace_f, beam_size, alpha)
        ends = (out == c.eos_id).any(axis=1)
        if not np.array_equal(out, again) or ends.all() or not ends.any() \
                or out.shape[1] < 4:
            continue  # want both endings (EOS and the length limit) and more than a token or two
        # The logits tolerance on the teacher-forced forward of the output itself.
        tgt_in = np.concatenate([np.full((len(src), 1), c.bos_id), out[:, :-1]], axis=1)
        tgt_in = np.where(np.cumsum(tgt_in == c.eos_id, axis=1) > 0, c.pad_id, tgt_in)
        ex, fa = {}, {}
        ref.forward(P, src, tgt_in, c, Numerics("exact"), ex)
        ref.forward(P, src, tgt_in, c, Numerics(c.dtype), fa)
        stats = _faithful_stats({"logits": ex["logits"]}, {"logits": fa["logits"]}, c, {"tgt": tgt_in}, {})
        tol = tolerance.logits_tolerance_abs(tolerance.ErrorStats(**stats["logits"]))
        margin = min(trace_x["margin"], trace_f["margin"])
        if margin >= tolerance.DECISION_MARGIN_FACTOR * tol:
            break
    else:
        raise RuntimeError(f"{name}: no seed gave decisions with a safe margin")
    meta = {"kind": kind, "tensors": {},
            "decode": {"beam_size": beam_size if kind == "beam" else None, "alpha": alpha if kind == "beam" else None,
                       "max_new_tokens": None, "margin": margin, "logits_tolerance": tol,
                       "margin_required": tolerance.DECISION_MARGIN_FACTOR * tol}}
    w.write(name, meta, {"src": src}, {"tokens": out}, c, params, seed, EOS_BOOST)


def _run_search(kind: str, P: ref.Params, src: np.ndarray, c: Config, nx: Numerics, trace: dict, beam_size: int,
                alpha: float) -> np.ndarray:
    if kind == "greedy":
        return search.greedy_search(P, src, c, nx, trace=trace)
    return search.beam_search(P, src, c, nx, beam_size, alpha, trace=trace)


# ----------------------------------------------------------------- all cases

LAYERS = ("positional_encoding", "embedding", "scaled_dot_product_attention", "multi_head_attention", "add_norm",
          "feed_forward", "encoder_layer", "decoder_layer", "output_projection")


def generate(root: Path) -> None:
    """Write every golden case under ``root``."""
    w = _Writer(root)
    _layer_case(w, "positional_encoding", "float32")  # an fp32 table in either mode
    for dtype in ("bfloat16", "float32"):
        for layer in LAYERS[1:]:
            _layer_case(w, layer, dtype)
    _layer_case(w, "scaled_dot_product_attention", "bfloat16", shifted=True)
    _forward_case(w, "forward_tiny_bfloat16", "tiny", "bfloat16", 1, [9, 9], 9, [7, 7], 7)
    _forward_case(w, "forward_tiny_float32", "tiny", "float32", 1, [9, 9], 9, [7, 7], 7)
    _forward_case(w, "forward_tiny_prenorm_bfloat16", "tiny_prenorm", "bfloat16", 2, [8, 8], 8, [6, 6], 6)
    _forward_case(w, "forward_small_bfloat16", "small", "bfloat16", 3, [10, 10], 10, [8, 8], 8,
                  layer_outputs_only=True)
    _forward_case(w, "forward_small_float32", "small", "float32", 3, [10, 10], 10, [8, 8], 8,
                  layer_outputs_only=True)
    _forward_case(w, "forward_padded_bfloat16", "tiny", "bfloat16", 4, [11, 5, 8], 11, [9, 3, 6], 9)
    _forward_case(w, "forward_causal_bfloat16", "tiny", "bfloat16", 5, [6, 6], 6, [8, 8], 8, causal_pair=True)
    _forward_case(w, "forward_base_bfloat16", "base", "bfloat16", 6, [6, 4], 6, [5, 5], 5, slice_last=24)
    _forward_case(w, "incremental_tiny_bfloat16", "tiny", "bfloat16", 7, [8, 5], 8, [7, 4], 7, incremental=True)
    _decode_case(w, "greedy_tiny_bfloat16", "greedy", "bfloat16", [6, 4, 7], 7)
    _decode_case(w, "greedy_tiny_float32", "greedy", "float32", [6, 4, 7], 7)
    _decode_case(w, "beam_tiny_float32", "beam", "float32", [5, 3, 6], 6)


def check(root: Path = GOLDEN_DIR) -> list[str]:
    """Regenerate into a temporary folder; the names of files that differ from ``root``."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        new = sorted(p.relative_to(tmp).as_posix() for p in Path(tmp).rglob("*") if p.is_file())
        old = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
        differ = sorted(set(new) ^ set(old))
        differ += [f for f in set(new) & set(old) if not filecmp.cmp(Path(tmp) / f, root / f, shallow=False)]
        return sorted(differ)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="regenerate in a temp dir and compare bit for bit")
    parser.add_argument("--out", type=Path, default=GOLDEN_DIR)
    args = parser.parse_args(argv)
    if args.check:
        differ = check(args.out)
        for f in differ:
            print(f"differs: {f}")
        print(f"golden check: {len(differ)} file(s) differ" if differ else
              "golden check: all files reproduced bit for bit")
        return 1 if differ else 0
    shutil.rmtree(args.out, ignore_errors=True)
    generate(args.out)
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"wrote {len(list(args.out.iterdir()))} cases to {args.out} ({size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
