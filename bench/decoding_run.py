"""The decoding workloads of ``bench.run`` (``--workloads greedy,beam``): the library's greedy and beam search, ours,
each dtype; greedy's per-step cost with the KV cache and without it (prefix recomputed)."""

from __future__ import annotations

from typing import Any

import numpy as np

from bench import verdict
from bench.common import inputs, measure_together, window_median

STEP_ROUNDS, MAX_STEP_ROUNDS = verdict.MIN_ROUNDS, 8   # rounds of the step series: at least, at most while undecided


def run_greedy(runner: Any) -> None:
    """Greedy search in each dtype, timed together (bf16 against fp32: the decoding-speed target); then each
    dtype's per-step cost with and without the cache, in rounds."""
    B, S, dtypes = runner.args.batch, runner.args.src_len, runner.args.dtypes
    short = runner.args.new_tokens[0]
    models = {dtype: (runner.ours(dtype), inputs(runner.configs[dtype], B, S, 1)[0]) for dtype in dtypes}
    calls = [lambda m=m, s=s: m.greedy(s, short) for m, s in models.values()]
    until = verdict.versus(dtypes.index("float32"), [dtypes.index("bfloat16")], 1.0, at_most=False) \
        if set(dtypes) >= {"float32", "bfloat16"} else None
    for dtype, timing in zip(dtypes, measure_together(calls, runner.args.repeats, until=until), strict=True):
        runner.record("greedy", models[dtype][0].name, dtype, {"B": B, "S": S, "new_tokens": short},
                      timing=timing.as_dict(), metrics={"tokens_per_s": B * short / timing.median_s})
    for dtype, (model, src) in models.items():
        _steps(runner, model, src, dtype)


def _steps(runner: Any, model: Any, src: np.ndarray, dtype: str) -> None:
    """Rounds of the per-step cost up to the long run's last token with the cache and over the short run
    without it, until the cache's speed-up (>= 5) and the step's growth (<= 1.10) are decided (at least
    ``STEP_ROUNDS``, at most ``MAX_STEP_ROUNDS``); the figures are the rounds' medians."""
    short, long = runner.args.new_tokens
    model.cached_steps(src, long)  # warm-up: compilation
    model.recomputed_steps(src, short)
    speedups, growths, cached = [], [], []
    while len(speedups) < STEP_ROUNDS or len(speedups) < MAX_STEP_ROUNDS and verdict.UNDECIDED in (
            verdict.judge(speedups, 5.0, at_most=False).outcome, verdict.judge(growths, 1.10).outcome):
        cached, recomputed = model.cached_steps(src, long), model.recomputed_steps(src, short)
        speedups.append(sum(recomputed) / sum(cached[:short]))
        growths.append(window_median(cached, long) / window_median(cached, short))
    runner.record("greedy_steps", model.name, dtype, {"B": runner.args.batch, "S": src.shape[1], "new_tokens": long},
                  cached_step_s=cached, recomputed_step_s=recomputed, cache_speedup_rounds=speedups,
                  step_growth_rounds=growths,
                  metrics={"tokens_per_s": runner.args.batch * long / sum(cached),
                           f"ms_per_step_at_{short}": window_median(cached, short) * 1e3,
                           f"ms_per_step_at_{long}": window_median(cached, long) * 1e3,
                           "step_growth": float(np.median(growths)), "cache_speedup": float(np.median(speedups))})


def run_beam(runner: Any) -> None:
    """Beam 4 and greedy search timed together in each dtype (beam over greedy: its target, <= 3)."""
    B, S, n = runner.args.batch, runner.args.src_len, runner.args.new_tokens[0]
    for dtype in runner.args.dtypes:
        model, (src, _) = runner.ours(dtype), inputs(runner.configs[dtype], B, S, 1)
        calls = [lambda m=model, s=src: m.greedy(s, n), lambda m=model, s=src: m.beam(s, n, 4)]
        greedy, timing = measure_together(calls, runner.args.repeats, until=verdict.versus(1, [0], 3.0))
        ratios = verdict.paired(timing.times_s, greedy.times_s)
        runner.record("beam", model.name, dtype, {"B": B, "S": S, "new_tokens": n, "beam_size": 4},
                      timing=timing.as_dict(), greedy_times_s=greedy.times_s,
                      metrics={"tokens_per_s": B * n / timing.median_s, "vs_greedy": float(np.median(ratios))})
