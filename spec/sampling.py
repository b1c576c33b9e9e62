"""Sampling the next token: temperature, top-k and top-p (nucleus), defined once so every backend draws the same.

For one row at one decoding step, from its fp32 logits z (V,) (``search.forbid_special`` applied: pad and BOS are
-inf, never drawn):

    temperature 0         greedy: the argmax, ties to the lower id (``spec.search``)
    1. temperature T > 0  z / T, the quotient in fp32 (T rounded to fp32)
    2. top-k              the k largest of those are kept, ties to the lower id; None keeps all
    3. softmax            over the kept tokens, max-subtracted; the kept tokens ordered by probability, descending,
                          ties to the lower id
    4. top-p              the shortest prefix of that order whose probabilities sum to at least p (Holtzman et al.,
                          2020), never empty; p = 1 keeps all
    5. draw               the kept prefix renormalised; the token is the first in that order whose cumulative
                          probability exceeds u

The uniforms u are part of the contract, so a backend cannot pass with its own RNG: ``uniforms(seed, B, steps)``
draws them on the host from NumPy's counter-based Philox, key ``seed``, counter (row, step, 0, 0), the first
double of each, so that row b's draw at step t depends on nothing else (not the other rows, not their lengths):
the same prompt at the same row index and seed draws the same tokens whatever the batch around it. A backend
computes steps 1-4 in fp32; the reference in float64 (exact) or rounding as a backend does (faithful). Where the
two differ by a rounding, a draw near a boundary may differ: ``trace`` records each draw's margins, as the decoding
golden cases record their decision margins.

``generate`` continues a batch of prompts with the decoder-only model: prompts right-padded, each row's generated
token t placed at position ``length_b + t`` (absolute positions, as the row alone would have them), drawn with
``u[b, t]``. The positions every row's prompt covers are fed in one prefill call; from there one position per
call, a row still inside its prompt fed its next prompt token (teacher forcing), the others their new token. A row
ends at EOS or after ``max_new_tokens``; the output is right-padded with ``pad_id`` to the longest row.

Raises (``check_sampling``): ``ValueError`` for a temperature that is negative, not finite or rounds to 0 in fp32
while positive, a top_k that is not an int >= 1, a top_p outside (0, 1] or NaN, or a seed outside [0, 2**64).
"""

from __future__ import annotations

import numpy as np

from spec import reference as ref
from spec import validate
from spec.config import Config
from spec.numerics import Numerics
from spec.search import forbid_special
from spec.validate import is_int

Trace = dict | None


def check_sampling(temperature: float, top_k: int | None, top_p: float, seed: int) -> None:
    """The sampling arguments' checks, before any computation (module docstring)."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.floating, np.integer)) \
            or not np.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if temperature > 0 and np.float32(temperature) == 0:
        raise ValueError(f"temperature {temperature!r} rounds to 0 in float32; use 0 for greedy decoding")
    if top_k is not None and (not is_int(top_k) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float, np.floating, np.integer)) \
            or not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must lie in (0, 1], got {top_p!r}")
    if not is_int(seed) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an int in [0, 2**64), got {seed!r}")


def uniforms(seed: int, batch: int, steps: int) -> np.ndarray:
    """The draws of ``batch`` rows over ``steps`` steps: (B, steps) float64 in [0, 1) (module docstring)."""
    u = np.empty((batch, steps))
    for b in range(batch):
        for t in range(steps):
            u[b, t] = np.random.Generator(np.random.Philox(key=seed, counter=[b, t, 0, 0])).random()
    return u


def sample(logits: np.ndarray, u: np.ndarray, temperature: float, top_k: int | None, top_p: float,
           nx: Numerics, trace: Trace = None) -> np.ndarray:
    """One step's tokens: logits (B, V) fp32 with pad and BOS at -inf, u (B,) -> tokens (B,) int64.

    With ``trace``, ``trace["rows"][b]`` holds the draw's margins: greedy, ``argmax_margin`` (the gap between the
    two largest logits); sampling, ``u_margin``, the distance of u from the
    nearest cumulative-probability boundary of the drawn prefix; ``top_k_margin``, the logit gap at the top-k cut
    (after temperature); ``top_p_margin``, the distance of the cumulative probability from p at the top-p cut (inf
    where a stage keeps everything).
    """
    rows = [] if trace is None else trace.setdefault("rows", [])
    out = np.empty(len(logits), np.int64)
    for b, (z, ub) in enumerate(zip(np.asarray(logits, np.float64), u, strict=True)):
        if temperature == 0:
            top2 = np.sort(z)[-2:]
            out[b], margins = int(np.argmax(z)), {"argmax_margin": float(top2[1] - top2[0])}
        else:
            out[b], margins = _sample_row(z, float(ub), temperature, top_k, top_p, nx)
        rows.append(margins)
    return out


def descending(z: np.ndarray) -> np.ndarray:
    """Token ids ordered by z (V,) descending, ties to the lower id."""
    return np.argsort(-z, kind="stable")


def top_p_count(cum: np.ndarray, top_p: float) -> int:
    """How many tokens top-p keeps of those whose cumulative probabilities are ``cum`` (descending order): the
    first whose cumulative probability reaches p and every one before it, never none; all at p = 1."""
    return min(int(np.searchsorted(cum, top_p, side="left")) + 1, len(cum)) if top_p < 1.0 else len(cum)


def _sample_row(z: np.ndarray, u: float, temperature: float, top_k: int | None, top_p: float, nx: Numerics
                ) -> tuple[int, dict]:
    """Steps 1-5 for one row: z (V,) -> (token, margins)."""
    z = nx.acc(z / nx.acc(temperature))                                      # 1. temperature, in fp32
    order = descending(z)
    order = order[np.isfinite(z[order])]                                      # pad, BOS: never drawn
    k = len(order) if top_k is None else min(top_k, len(order))
    top_k_margin = float(z[order[k - 1]] - z[order[k]]) if k < len(order) else np.inf
    kept = order[:k]                                                          # 2. top-k
    e = np.exp(z[kept] - z[kept[0]])
    p = nx.acc(e / e.sum())                                                   # 3. softmax, in descending order
    cum = nx.acc(np.cumsum(p))
    n = top_p_count(cum, top_p)                                               # 4. top-p
    top_p_margin = np.inf                                                     # the cut between n - 1 and n tokens
    if top_p < 1.0:
        top_p_margin = float(min(abs(cum[n - 1] - top_p), abs(cum[n - 2] - top_p) if n > 1 else np.inf))
    c = nx.acc(np.cumsum(p[:n]) / nx.acc(p[:n].sum()))                        # 5. renormalised, then drawn
    c[-1] = 1.0                                                               # u < 1 always draws from the prefix
    j = min(int(np.searchsorted(c, u, side="right")), n - 1)
    u_margin = float(min(c[j] - u, u - c[j - 1] if j > 0 else u))
    return int(kept[j]), {"u_margin": u_margin, "top_k_margin": top_k_margin, "top_p_margin": top_p_margin}


def generate(params: ref.Params, prompt: np.ndarray, c: Config, nx: Numerics, max_new_tokens: int,
             temperature: float = 1.0, top_k: int | None = None, top_p: float = 1.0, seed: int = 0,
             trace: Trace = None) -> np.ndarray:
    """The decoder-only model's continuation of prompt (B, L) (module docstring) -> tokens (B, N) int64, EOS
    included, right-padded with ``pad_id``, N <= max_new_tokens. With ``trace``, ``trace["rows"][b]`` lists the
    margins of each of row b's draws (``sample``).

    Raises:
        ValueError: from ``validate.check_prompt`` and ``check_sampling``.
    """
    prompt = np.asarray(prompt)
    lengths = validate.check_prompt(prompt, c, max_new_tokens)
    check_sampling(temperature, top_k, top_p, seed)
    B, first = len(prompt), int(lengths.min())
    model = ref.LanguageModel(params, c, nx)
    cache = model.init_cache(B, int(lengths.max()) + max_new_tokens)
    u, out = uniforms(seed, B, max_new_tokens), np.full((B, max_new_tokens), c.pad_id, np.int64)
    rows = None if trace is None else trace.setdefault("rows", [[] for _ in range(B)])
    done = np.zeros(B, bool)
    logits, cache = model.decode(prompt[:, :first], cache)                   # prefill
    for pos in range(first, first + int(lengths.max() - lengths.min()) + max_new_tokens):
        step = pos - lengths                                                  # each row's next token; < 0: prompt
        live = np.flatnonzero((step >= 0) & ~done)
        step_trace = None if trace is None else {}
        drawn = sample(forbid_special(logits[live, -1], c), u[live, step[live]], temperature, top_k, top_p, nx,
                       step_trace)
        out[live, step[live]] = drawn
        for i, b in enumerate(live if rows is not None else ()):
            rows[b].append(step_trace["rows"][i])
        done[live] |= (drawn == c.eos_id) | (step[live] + 1 == max_new_tokens)
        if done.all():
            break
        new = out[np.arange(B), np.clip(step, 0, max_new_tokens - 1)]
        fed = np.where(step < 0, prompt[:, min(pos, prompt.shape[1] - 1)], new)      # teacher-forced in the prompt
        logits, cache = model.decode(np.where(done, c.pad_id, fed)[:, None], cache)
    return out[:, :int((out != c.pad_id).sum(axis=1).max())]
