"""Golden test vectors: their format, configs, weights and writer, and what the conformance suite reads of them.

    python -m tools.golden            # (re)write spec/golden/ (``nox -s golden``)
    python -m tools.golden --check    # regenerate in a temp dir, compare with the committed files

One folder per case, in the style of the ONNX backend tests:

    meta.json               case, kind, config, generator version, tolerance policy, how to make
                            the weights, the faithful reference's error per tensor, sha256 of each file
    inputs.safetensors      the inputs, in their contract dtypes
    expected.safetensors    the float64 ("exact") value of every checked tensor, or the tokens

Kinds: "layer" (one layer alone), "forward" (all intermediates of a
teacher-forced forward), "incremental" (per-step logits with the KV cache):
``spec.golden_recipes``; "greedy" and "beam" (output tokens):
``spec.golden_search``; "train" (the loss, gradients and weights after Adam
steps): ``spec.golden_training``. ``spec.golden_recipes.generate`` writes every
case and ``check`` compares a regeneration with the committed files.

Weights are not stored, but for the cases that need a trained model: ``case_params(meta)`` regenerates
them from the seed (``init_params(..., observable=True)``, so every bias and LayerNorm scale is
visible) and checks them against the sha256 recorded in ``meta["params"]``.
That keeps the committed files small and makes the init part of what
``--check`` verifies. A case decoded by a trained model (``meta["params"]["trained"]`` says how it was
trained) stores its weights as ``params.safetensors`` in the case folder, made from a file under
``GOLDEN_INPUTS``.

Each checked tensor's errors are measured in units of the eps of
``meta["tensors"][name]["unit"]``: the config's dtype, except a layer alone
whose contract output is fp32 (positional encoding, logits), measured in fp32
eps so that a backend rounding it to bf16 fails.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import safetensors.numpy

from spec import tolerance
from spec.config import BASE, LM_TINY, TINY, Config
from spec.demo import DEMO_CONFIG
from spec.init import init_params
from spec.schema import param_specs

GENERATOR_VERSION = "2"
GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
GOLDEN_INPUTS = Path(__file__).resolve().parent / "golden_inputs"  # trained weights the decoding cases start from
# A multi-layer config distinct from tiny: d_k = d_v, three layers per stack.
SMALL = Config(vocab_size=97, d_model=64, n_heads=4, d_k=16, d_v=16, d_ff=128,
               n_encoder_layers=3, n_decoder_layers=3, max_len=64, dropout=0.1)
# tiny_decoding: room for the residual-cancelling last FFN of the decoding cases (2 * d_model hidden units).
CONFIGS = {"tiny": TINY, "tiny_prenorm": TINY.replace(norm_first=True), "small": SMALL, "base": BASE,
           "tiny_decoding": TINY.replace(d_ff=80), "reverse": DEMO_CONFIG,
           # decoder-only (``spec.golden_lm``); lm_tiny_decoding as tiny_decoding
           "lm_tiny": LM_TINY, "lm_tiny_postnorm": LM_TINY.replace(norm_first=False),
           "lm_tiny_decoding": LM_TINY.replace(norm_first=False, d_ff=80),
           # the checkpoint options (``spec.config``): Marian's layers; GELU with learned, unscaled positions; GPT-2's
           "tiny_marian": TINY.replace(activation="silu", attention_bias=True, logits_bias=True,
                                       positions="sinusoidal_halves", layer_norm_eps=1e-5),
           "tiny_gelu": TINY.replace(activation="gelu", attention_bias=True, positions="learned",
                                     scale_embedding=False),
           "lm_tiny_gpt2": LM_TINY.replace(activation="gelu_tanh", attention_bias=True, logits_bias=True,
                                           positions="learned", scale_embedding=False, layer_norm_eps=1e-5),
           # the same options in shapes MarianMTModel and GPT2LMHeadModel can hold (``spec.convert``): heads of
           # d_k = d_v = d_model / n_heads; GPT-2's output projection without a bias (its table is the embedding)
           "tiny_marian_hf": TINY.replace(d_k=8, d_v=8, activation="silu", attention_bias=True, logits_bias=True,
                                          positions="sinusoidal_halves", layer_norm_eps=1e-5),
           "lm_tiny_gpt2_hf": LM_TINY.replace(d_k=8, d_v=8, activation="gelu_tanh", attention_bias=True,
                                              positions="learned", scale_embedding=False, layer_norm_eps=1e-5)}
EOS_BOOST = 2.0  # decoding cases scale E[eos] (by a power of two, exact) so that some hypotheses end


def config(name: str, dtype: str, param_dtype: str | None = None) -> Config:
    return CONFIGS[name].replace(dtype=dtype, param_dtype=param_dtype or dtype)


def positions_of(tensor: str) -> str | None:
    """Which token positions index axis 1 of a recorded tensor: "src", "tgt" or None."""
    if tensor.endswith("@rows"):  # whole rows at chosen (batch, position) pairs: no position axis
        return None
    if tensor.startswith(("src_embed", "encoder.")):
        return "src"
    if tensor.startswith(("tgt_embed", "decoder.", "logits", "step_logits")):
        return "tgt"
    return None


def checked_part(name: str, full: dict[str, np.ndarray], sampling: dict) -> np.ndarray:
    """The part of a recorded tensor that a case stores and checks (``meta["sampling"]``): ``full[name]`` at
    ``columns`` feature columns spread evenly over its last axis (all if not given), or, for
    ``"logits@rows"``, whole logit rows over the vocabulary at the sampled (batch, position) pairs."""
    if name.endswith("@rows"):
        b, t = np.asarray(sampling["rows"]).T
        return np.asarray(full[name.removesuffix("@rows")])[b, t]
    x, n = np.asarray(full[name]), sampling.get("columns")
    return x if n is None else x[..., np.unique(np.linspace(0, x.shape[-1] - 1, n).round().astype(int))]


def valid_rows(x: np.ndarray, ids: np.ndarray | None, pad_id: int) -> np.ndarray:
    """The rows of ``x`` (B, L, ...) at non-pad positions of ``ids`` (B, L): outputs at
    padding positions are unspecified (``spec.numerics`` rule 4)."""
    return x if ids is None else x[ids != pad_id]


def random_tokens(rng: np.random.Generator, c: Config, lengths: list[int], L: int, bos: bool) -> np.ndarray:
    ids = rng.integers(3, c.vocab_size, (len(lengths), L)).astype(np.int64)
    if bos:
        ids[:, 0] = c.bos_id
    for b, n in enumerate(lengths):
        ids[b, n:] = c.pad_id
    return ids


class Writer:
    def __init__(self, root: Path):
        self.root = root

    def write(self, name: str, meta: dict, inputs: dict, expected: dict, c: Config, params: dict,
              seed: int, eos_boost: float | None = None, cancel_residual: bool = False,
              embedding_scale: float | None = None, faithful: dict | None = None, trained: dict | None = None
              ) -> None:
        """One case folder: inputs, the exact ``expected`` tensors, with ``faithful`` the bf16-faithful reference's
        values too (``faithful.safetensors``, for ``spec.agreement``), with ``trained`` (how they were trained) the
        weights (``params.safetensors``), and ``meta.json``."""
        d = self.root / name
        d.mkdir(parents=True, exist_ok=True)
        files = {"inputs.safetensors": inputs, "expected.safetensors": expected}
        if faithful is not None:
            files["faithful.safetensors"] = faithful
        if trained is not None:
            files["params.safetensors"] = params
        for fname, tensors in files.items():
            safetensors.numpy.save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(d / fname))
        meta = {"case": name, "generator_version": GENERATOR_VERSION, "config": c.to_dict(),
                "params": {"seed": seed, "observable": True, "eos_boost": eos_boost,
                           "cancel_residual": cancel_residual, "embedding_scale": embedding_scale,
                           "sha256": params_digest(params)} if trained is None else
                          {"file": "params.safetensors", "trained": trained, "sha256": params_digest(params)},
                "tolerance_policy": {"max_ratio": tolerance.MAX_RATIO, "rms_ratio": tolerance.RMS_RATIO,
                                     "floor_eps": tolerance.FLOOR_EPS, "rms_allowance": "floor_eps / sqrt(n)"},
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


def make_params(c: Config, seed: int, eos_boost: float | None = None, cancel_residual: bool = False,
                embedding_scale: float | None = None) -> dict[str, np.ndarray]:
    """Golden-case weights: observable init; for decoding cases E[eos] scaled by ``eos_boost``, the whole
    embedding by ``embedding_scale`` (rounded to the parameter dtype; tied to the output projection, this
    sharpens the output distribution, so longer hypotheses stay competitive and the length penalty can
    decide) and, with ``cancel_residual``, the last decoder FFN made to cancel its input."""
    params = init_params(c, seed, observable=True)
    if eos_boost is not None:
        params["embedding"][c.eos_id] *= eos_boost
    if embedding_scale is not None:
        params["embedding"] *= embedding_scale
    if cancel_residual:
        _cancel_last_residual(params, c)
    return params


def _cancel_last_residual(params: dict[str, np.ndarray], c: Config) -> None:
    """Make the last decoder FFN compute ``-x + FFN_random(x)``: ReLU(x) - ReLU(-x) = x, through 2D hidden units
    with identity weights and zero bias (exact in bf16), so its post-LN output no longer carries the input.

    Why: with the embedding tied to the output projection, a random model's last hidden state is dominated by
    the current token's own embedding, so greedy search repeats one token forever. Without it the next token is a
    random function of the state, the source included.
    """
    D, p = c.d_model, f"decoder.layers.{c.n_decoder_layers - 1}.ffn"
    if c.d_ff < 2 * D:
        raise ValueError(f"cancel_residual needs d_ff >= 2 * d_model, got {c.d_ff}")
    eye = np.eye(D).astype(params[f"{p}.w_1"].dtype)
    params[f"{p}.w_1"][:, :D], params[f"{p}.w_1"][:, D:2 * D] = eye, -eye   # (D, F): hidden ReLU(x), ReLU(-x)
    params[f"{p}.b_1"][:2 * D] = 0
    params[f"{p}.w_2"][:D], params[f"{p}.w_2"][D:2 * D] = -eye, eye         # (F, D): -ReLU(x) + ReLU(-x) = -x


def case_params(meta: dict, stored: dict[str, np.ndarray] | None = None) -> tuple[Config, dict[str, np.ndarray]]:
    """The config and weights of a golden case, regenerated (or ``stored``, the case's ``params.safetensors``, for
    a case whose weights were trained) and checked against ``meta``.

    Raises:
        ValueError: if the weights' sha256 differs from the recorded one, or a trained case's are not given.
    """
    c = Config.from_dict(meta["config"])
    p = meta["params"]
    if "trained" in p and not stored:
        raise ValueError(f"golden case {meta['case']}: trained weights, stored in its params.safetensors")
    if "trained" in p:
        params = {spec.name: stored[spec.name] for spec in param_specs(c)}  # schema order, as the digest wants
    else:
        params = make_params(c, p["seed"], p["eos_boost"], p["cancel_residual"], p["embedding_scale"])
    if params_digest(params) != p["sha256"]:
        raise ValueError(f"golden case {meta['case']}: its weights differ from the recorded sha256")
    return c, params


def faithful_stats(exact: dict, faithful: dict, c: Config, ids: dict, sampling: dict, names=None,
                    unit: str | None = None) -> dict:
    out = {}
    for name in names or exact:
        pid = ids.get(positions_of(name))
        xs, fs = checked_part(name, exact, sampling), checked_part(name, faithful, sampling)
        out[name] = tolerance.error_stats(valid_rows(fs, pid, c.pad_id), valid_rows(xs, pid, c.pad_id),
                                          unit or c.dtype).to_dict()
    return out
