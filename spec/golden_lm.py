"""The decoder-only golden cases: forward, incremental decoding, generation (greedy and sampled) and training.

Kinds as the encoder-decoder's (``spec.golden_cases``), with one token sequence in place of src and tgt_in:
"forward" and "incremental" cases store ``tokens`` (B, T), right-padded rows that start with BOS; "train" cases
``tokens`` (STEPS, B, T + 1), next-token prediction (``spec.golden_training``); "generate" cases ``prompt`` (B, L),
right-padded, and the new ``tokens`` (B, N) of ``spec.sampling.generate`` with the settings of
``meta["decode"]``.

A generation case is written only if every draw of every row is decided: exact and faithful give the same tokens
and each draw's margins (``spec.sampling.sample``'s trace) exceed ``DECISION_MARGIN_FACTOR`` times what the logits
tolerance ``tol`` can move (the tolerance on the teacher-forced forward of the prompts and the tokens drawn):
the argmax gap ``tol`` itself (greedy), the top-k cut ``tol / temperature`` (logits are divided by it before the
cut), and the uniform's and top-p's distances in probability ``expm1(2 tol / temperature)`` (logits each within
``tol`` move every probability by a factor within ``exp(+-2 tol / T)``, so every cumulative sum by at most that
much). Random weights decide by such margins in fp32 only (bf16 tolerances are about 0.1-0.3 of a logit), so the
random-weight generation cases are fp32; the bf16 greedy case decodes with a trained model (the reverse task,
``tools.train_lm_reverse``), as the encoder-decoder's bf16 decoding cases do. Sampling in bf16 has no case: a
uniform falls near a boundary of a trained model's peaked distribution as often as of any other.
"""

from __future__ import annotations

import json
import zlib

import numpy as np

from spec import demo, sampling, tolerance
from spec import reference as ref
from spec.config import Config
from spec.golden_cases import GOLDEN_INPUTS, Writer, config, faithful_stats, make_params, random_tokens, valid_rows
from spec.numerics import Numerics, np_dtype
from spec.recording import recording
from spec.schema import param_specs
from spec.weights_io import load_weights


def forward_case(w: Writer, name: str, cfg: str, dtype: str, seed: int, lengths: list[int], T: int, *,
                 incremental: bool = False, param_dtype: str | None = None) -> None:
    """Every intermediate of a forward of tokens (B, T), or (``incremental``) the logits of one position per
    ``decode`` call, measured as the faithful reference's."""
    c = config(cfg, dtype, param_dtype)
    params = make_params(c, seed)
    tokens = random_tokens(np.random.default_rng(zlib.crc32(name.encode())), c, lengths, T, True)
    P = ref.as_float64(params, c)
    models = {mode: ref.LanguageModel(P, c, Numerics(mode)) for mode in ("exact", c.dtype)}
    with recording() as exact:
        models["exact"].forward(tokens)
    with recording() as faithful:
        models[c.dtype].forward(tokens)
    if incremental:
        exact, faithful = {"step_logits": exact["logits"]}, {"step_logits": _incremental(models[c.dtype], tokens)}
    meta = {"kind": "incremental" if incremental else "forward", "sampling": {},
            "tensors": faithful_stats(exact, faithful, c, {"tgt": tokens}, {})}
    w.write(name, meta, {"tokens": tokens}, exact, c, params, seed)


def _incremental(model: ref.LanguageModel, tokens: np.ndarray) -> np.ndarray:
    cache = model.init_cache(tokens.shape[0], tokens.shape[1])
    steps = []
    for t in range(tokens.shape[1]):
        logits, cache = model.decode(tokens[:, t:t + 1], cache)
        steps.append(logits)
    return np.concatenate(steps, axis=1)


def _logits_tolerance(P: ref.Params, prompt: np.ndarray, out: np.ndarray, c: Config) -> float:
    """The logits tolerance on the forward of each prompt followed by its tokens (``_decision_tolerance`` of
    ``spec.golden_search``, for a decoder-only model)."""
    lengths = (prompt != c.pad_id).sum(axis=1)
    seqs = np.full((len(prompt), prompt.shape[1] + out.shape[1]), c.pad_id, np.int64)
    for b, n in enumerate(lengths):
        seqs[b, :n], seqs[b, n:n + out.shape[1]] = prompt[b, :n], out[b]
    ex, fa = (ref.LanguageModel(P, c, Numerics(m)).forward(seqs) for m in ("exact", c.dtype))
    stats = tolerance.error_stats(valid_rows(fa, seqs, c.pad_id), valid_rows(ex, seqs, c.pad_id), c.dtype)
    return tolerance.logits_tolerance_abs(stats)


def draw_margins(rows: list[list[dict]], tol: float, temperature: float) -> list[dict]:
    """Per row: the smallest margin of each kind over its draws, divided by what the tolerance can move it
    (module docstring); a row is decided where every ratio is at least ``DECISION_MARGIN_FACTOR``."""
    slack = {"argmax_margin": tol} if temperature == 0 else {
        "u_margin": np.expm1(2 * tol / temperature), "top_p_margin": np.expm1(2 * tol / temperature),
        "top_k_margin": tol / temperature}
    return [{k: float(min(d[k] for d in draws) / s) for k, s in slack.items()} for draws in rows]


def generate_case(w: Writer, name: str, cfg: str, seed: int, settings: dict, max_new_tokens: int,
                  eos_boost: float, rows: int = 4, pool: int = 48, trained: str | None = None,
                  eos_lengths: int = 2) -> None:
    """Build a batch from a pool of prompts, a row at a time: a prompt joins if the batch with it is decided (module
    docstring; row b draws with its own uniforms, so a row is judged where it stands) and repeats no token over half
    its length; where greedy, the first rows must end at EOS at new lengths until ``eos_lengths`` are seen. Random
    weights of ``cfg`` from ``seed`` and prompts of 2-7 tokens, or a ``trained`` model (a file under
    ``GOLDEN_INPUTS``) and prompts of its task (``spec.demo.lm_reverse_batch``)."""
    c, params, candidates = _model_and_prompts(name, cfg, seed, eos_boost, pool, trained)
    P = ref.as_float64(params, c)
    chosen, decided = [], None
    for b in range(pool):
        trial = _decided(P, candidates[[*chosen, b]], c, settings, max_new_tokens)
        if trial is not None and (settings["temperature"] > 0 or _new_eos_length(trial[0], c, eos_lengths)):
            chosen, decided = [*chosen, b], trial
        if len(chosen) == rows:
            break
    else:
        raise RuntimeError(f"{name}: {len(chosen)} rows of {rows} from a pool of {pool}")
    out, margins, tol = decided
    prompt = candidates[chosen][:, :int((candidates[chosen] != c.pad_id).sum(axis=1).max())]
    meta = {"kind": "generate", "tensors": {},
            "decode": {**settings, "max_new_tokens": max_new_tokens, "logits_tolerance": tol,
                       "margin_factor": tolerance.DECISION_MARGIN_FACTOR, "margins_over_slack": margins,
                       "rows": [{"length": int((r != c.pad_id).sum()), "eos": bool((r == c.eos_id).any())}
                                for r in out]}}
    info = None if trained is None else json.loads((GOLDEN_INPUTS / trained).with_suffix(".json").read_text())
    w.write(name, meta, {"prompt": prompt}, {"tokens": out}, c, params, seed, eos_boost, cfg == "lm_tiny_decoding",
            trained=info)


def _model_and_prompts(name: str, cfg: str, seed: int, eos_boost: float, pool: int, trained: str | None
                       ) -> tuple[Config, dict[str, np.ndarray], np.ndarray]:
    """The config, weights and candidate prompts (pool, L) of a generation case (``generate_case``)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    if trained is not None:
        c, params = load_weights(GOLDEN_INPUTS / trained)
        params = {p.name: params[p.name].astype(np_dtype(c.param_dtype)) for p in param_specs(c)}
        tokens = demo.lm_reverse_batch(rng, c, pool)                          # BOS seq EOS rev EOS
        first_eos = np.argmax(tokens == c.eos_id, axis=1)
        return c, params, np.where(np.arange(tokens.shape[1]) <= first_eos[:, None], tokens, c.pad_id)
    c = config(cfg, "float32")
    params = make_params(c, seed, eos_boost=eos_boost, cancel_residual=cfg == "lm_tiny_decoding")
    return c, params, random_tokens(rng, c, list(rng.integers(2, 8, pool)), 7, True)


def _decided(P: ref.Params, prompt: np.ndarray, c: Config, settings: dict, max_new_tokens: int):
    """(tokens, per-row margins, tol) if exact and faithful agree and every draw is decided, else None."""
    traces = {m: {} for m in ("exact", c.dtype)}
    outs = {m: sampling.generate(P, prompt, c, Numerics(m), max_new_tokens, **settings, trace=traces[m])
            for m in traces}
    if not np.array_equal(outs["exact"], outs[c.dtype]):
        return None
    out = outs["exact"]
    body = [r[:np.flatnonzero(r == c.eos_id)[0]] if (r == c.eos_id).any() else r[r != c.pad_id] for r in out]
    if any(len(b) and np.bincount(b).max() > max(1, len(b) // 2) for b in body):
        return None
    tol = _logits_tolerance(P, prompt, out, c)
    margins = [{k: min(x[k], f[k]) for k in x} for x, f in zip(
        *(draw_margins(traces[m]["rows"], tol, settings["temperature"]) for m in traces), strict=True)]
    ok = all(v >= tolerance.DECISION_MARGIN_FACTOR for m in margins for v in m.values())
    return (out, margins, tol) if ok else None


def _new_eos_length(out: np.ndarray, c: Config, lengths: int) -> bool:
    """Whether the last row ends at EOS at a length no earlier row ends at, or ``lengths`` are already seen."""
    ends = [int(np.flatnonzero(r == c.eos_id)[0]) + 1 if (r == c.eos_id).any() else 0 for r in out]
    earlier = {n for n in ends[:-1] if n}
    return len(earlier) >= lengths or (ends[-1] > 0 and ends[-1] not in earlier)


SAMPLE_SETTINGS = ({"temperature": 0.0, "top_k": None, "top_p": 1.0}, {"temperature": 1.0, "top_k": None, "top_p": 1.0},
                   {"temperature": 0.5, "top_k": 5, "top_p": 1.0}, {"temperature": 1.25, "top_k": None, "top_p": 0.8},
                   {"temperature": 0.8, "top_k": 10, "top_p": 0.9})


def sample_case(w: Writer, name: str, rows: int = 24, V: int = 32) -> None:
    """``spec.sampling.sample`` alone, on given fp32 logits with exact ties (a grid of quarters, pad and BOS at
    -inf), so that the tie rules decide some draws: for each of ``SAMPLE_SETTINGS``, the rows whose draws are
    decided (a margin of 0 is an exact tie, which the rule decides; any other margin at least 1e-3: an fp32
    softmax and cumulative sum are within 1e-6)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    c = config("lm_tiny", "float32").replace(vocab_size=V)
    logits = (rng.integers(-8, 9, (len(SAMPLE_SETTINGS) * rows, V)) / 4).astype(np.float32)
    logits[:, [c.pad_id, c.bos_id]] = -np.inf
    u = rng.random(len(logits))
    tokens, margins, keep = [], [], []
    for i, settings in enumerate(SAMPLE_SETTINGS):
        part = slice(i * rows, (i + 1) * rows)
        trace = {}
        tokens.append(sampling.sample(logits[part], u[part], **settings, nx=Numerics("exact"), trace=trace))
        ok = [all(v == 0 or v >= 1e-3 for v in m.values()) for m in trace["rows"]]
        keep.append(np.flatnonzero(ok) + i * rows)
        margins += [m for m, k in zip(trace["rows"], ok, strict=True) if k]
    keep = np.concatenate(keep)
    setting = np.repeat(np.arange(len(SAMPLE_SETTINGS)), rows)[keep]
    meta = {"kind": "sample", "tensors": {}, "settings": list(SAMPLE_SETTINGS), "margins": margins}
    w.write(name, meta, {"logits": logits[keep], "u": u[keep], "setting": setting},
            {"tokens": np.concatenate(tokens)[keep]}, c, {}, 0)


GENERATE_CASES = (  # name, config, weights' seed, settings, max_new_tokens, eos_boost
    ("lm_greedy_tiny_float32", "lm_tiny_decoding", 101, {"temperature": 0.0}, 12, 1.0),
    ("lm_sample_tiny_float32", "lm_tiny", 102, {"temperature": 1.0, "top_k": None, "top_p": 1.0, "seed": 7}, 10,
     1.5),
    ("lm_sample_topk_topp_tiny_float32", "lm_tiny", 103,
     {"temperature": 0.7, "top_k": 8, "top_p": 0.9, "seed": 11}, 10, 1.5),
)


def generate(w: Writer) -> None:
    """Write every decoder-only case but training (``spec.golden_training`` writes those)."""
    forward_case(w, "lm_forward_tiny_bfloat16", "lm_tiny", "bfloat16", 31, [9, 5, 7], 9)
    forward_case(w, "lm_forward_tiny_float32", "lm_tiny", "float32", 31, [9, 5, 7], 9)
    forward_case(w, "lm_forward_tiny_bfloat16_params_float32", "lm_tiny", "bfloat16", 32, [8, 6], 8,
                 param_dtype="float32")
    forward_case(w, "lm_forward_tiny_postnorm_bfloat16", "lm_tiny_postnorm", "bfloat16", 33, [7, 4], 7)
    forward_case(w, "lm_incremental_tiny_bfloat16", "lm_tiny", "bfloat16", 34, [8, 5], 8, incremental=True)
    forward_case(w, "lm_forward_tiny_gpt2_bfloat16", "lm_tiny_gpt2", "bfloat16", 43, [9, 5, 7], 9)
    forward_case(w, "lm_incremental_tiny_gpt2_bfloat16", "lm_tiny_gpt2", "bfloat16", 44, [8, 5], 8, incremental=True)
    for dtype in ("bfloat16", "float32"):  # lm_tiny_gpt2's options in the shapes GPT2LMHeadModel can hold
        forward_case(w, f"lm_forward_tiny_gpt2_hf_{dtype}", "lm_tiny_gpt2_hf", dtype, 47, [9, 5, 7], 9)
        forward_case(w, f"lm_incremental_tiny_gpt2_hf_{dtype}", "lm_tiny_gpt2_hf", dtype, 48, [8, 5], 8,
                     incremental=True)
    sample_case(w, "lm_sample_ties")
    for name, cfg, seed, settings, max_new, eos_boost in GENERATE_CASES:
        generate_case(w, name, cfg, seed, settings, max_new, eos_boost)
    # bf16 greedy decisions of a trained model (``tools.train_lm_reverse``): rows that end at EOS at three lengths.
    generate_case(w, "lm_greedy_reverse_bfloat16", "", 0, {"temperature": 0.0}, 20, 1.0, pool=64,
                  trained="lm_reverse.safetensors", eos_lengths=3)
