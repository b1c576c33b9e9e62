"""The decoder-only workloads of ``bench.run`` (``--workloads lm``): prefill, decode steps and greedy generation,
our ``LanguageModel`` beside the framework's stock GPT-2 at the same size, each dtype, at each batch.

- ``lm_prefill``: an empty cache, then one call over a (B, L) prompt; FLOPs ``forward_flops(c, B, 0, L)``.
- ``lm_decode``: one-token greedy steps after a prefill of the first ``--lm-short`` tokens and after the whole
  prompt, both in a cache of capacity L + steps (as one generation runs from the short context to the long);
  FLOPs of a step at context L ``decode_flops(c, B, 1, L)``. Decode tokens/s are B over the step at context L.
- ``lm_generate``: the library's greedy generation (temperature 0) of ``--lm-new-tokens`` after the prompt.

Every record keeps its per-round times (``times_s``): the rounds interleave the subjects, so the report's ratios
and their spreads pair figures of the same round.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from bench import verdict
from bench.common import bench_params, clock, measure_together
from bench.lm_common import LMSubject, capacity, lm_config, prompts
from spec.flops import decode_flops, forward_flops


def run_lm(runner: Any) -> None:
    """All three workloads at every ``--lm-batches`` B, the subjects (ours and the peer per dtype) built once."""
    args = runner.args
    fw = importlib.import_module(f"bench.lm_{args.framework}")
    configs = {dt: lm_config(args.lm_size, dt) for dt in args.dtypes}
    subjects: list[LMSubject] = []
    for config in configs.values():
        subjects += [fw.ours(config, bench_params(config), args.device), fw.peer(config, args.device)]
    for B in args.lm_batches:
        prompt = prompts(configs[args.dtypes[0]], B, args.lm_prompt)                     # (B, L)
        _prefill(runner, subjects, configs, prompt)
        _decode(runner, subjects, configs, prompt)
        _generate(runner, subjects, prompt)


def _record(runner: Any, workload: str, subject: LMSubject, dims: dict[str, int], times: list[float],
            first_s: float, flops: int | None = None, **fields: Any) -> None:
    t = np.asarray(times)
    timing = {"first_s": first_s, "median_s": float(np.median(t)), "min_s": float(t.min()), "max_s": float(t.max()),
              "repeats": len(t)}
    tokens = dims["B"] * (dims["L"] if workload == "lm_prefill" else dims.get("new_tokens", 1))
    metrics = {"tokens_per_s": tokens / timing["median_s"]}
    if flops:
        metrics["flop_per_s"] = flops / timing["median_s"]
    runner.record(workload, subject.name, subject.dtype, dims, timing=timing, times_s=list(times), flops=flops,
                  **fields, metrics=metrics)


def _prefill(runner: Any, subjects: list[LMSubject], configs: dict, prompt: np.ndarray) -> None:
    B, L = prompt.shape
    timings = measure_together([lambda s=s: s.prefill(prompt) for s in subjects], runner.args.repeats)
    for s, t in zip(subjects, timings, strict=True):
        _record(runner, "lm_prefill", s, {"B": B, "L": L}, t.times_s, t.first_s,
                forward_flops(configs[s.dtype], B, 0, L))


def _decode(runner: Any, subjects: list[LMSubject], configs: dict, prompt: np.ndarray) -> None:
    """Per round and subject, the median of ``--lm-steps`` steps at each context; a first round untimed
    (compilation, first allocations)."""
    args, (B, L) = runner.args, prompt.shape
    steps, short = args.lm_steps, args.lm_short
    cap = capacity(configs[subjects[0].dtype], L, steps)
    rounds: list[list[tuple[float, float]]] = [[] for _ in subjects]
    start = clock()
    for r in range(args.repeats + 1):
        for s, mine in zip(subjects, rounds, strict=True):
            at = [float(np.median(s.decode_steps(prompt[:, :ctx], steps, cap))) for ctx in (short, L)]
            mine.append((at[0], at[1]))
        if r >= verdict.MIN_ROUNDS and clock() - start > 120:   # as measure_together: a verdict's rounds, a budget
            break
    for s, mine in zip(subjects, rounds, strict=True):
        (first_short, first_long), timed = mine[0], mine[1:]
        at_short, at_long = [m[0] for m in timed], [m[1] for m in timed]
        _record(runner, "lm_decode", s, {"B": B, "L": L, "short": short, "steps": steps, "capacity": cap}, at_long,
                first_long, decode_flops(configs[s.dtype], B, 1, L), short_step_s=at_short,
                first_short_step_s=first_short)


def _generate(runner: Any, subjects: list[LMSubject], prompt: np.ndarray) -> None:
    B, L = prompt.shape
    n = runner.args.lm_new_tokens
    timings = measure_together([lambda s=s: s.generate(prompt, n) for s in subjects], runner.args.repeats)
    for s, t in zip(subjects, timings, strict=True):
        _record(runner, "lm_generate", s, {"B": B, "L": L, "new_tokens": n}, t.times_s, t.first_s)
