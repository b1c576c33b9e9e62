"""The translation workload of ``bench.run`` (``--workloads translate``): the workload's sentences translated
greedily and with beam 4, at each ``--translate-batches`` B, by ours in each dtype and, in torch's environment,
by Hugging Face's ``MarianMTModel`` in each dtype and CTranslate2 in float32 and int8 (its fastest CPU compute
type here: its CPU build has no bf16), all holding the same weights (``bench.translate_common``).

Each system runs in a process of its own (``bench.translate_worker``), so a record's ``peak_rss_mb`` is that
system's peak resident memory, framework included (``framework_rss_mb``: the process before the model was
built). ``--translate-rounds`` rounds start one process per system in turn, so that the machine's drift weighs
on each alike; a record keeps each round's median pass (``times_s``) and each round's peak memory
(``peak_rss_runs_mb``; ``peak_rss_mb`` is their median), and the report's ratios pair the figures of one round.
Tokens/s count the tokens one pass generates (every sentence ``NEW_TOKENS``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np

from bench import translate_common as tc


def peers(framework: str, dtypes: list[str]) -> list[tuple[str, str]]:
    """The peers that run in ``framework``'s environment: (system, dtype or compute type)."""
    if framework != "torch":
        return []
    return [("transformers", dtype) for dtype in dtypes] + [("ctranslate2", "float32"), ("ctranslate2", "int8")]


def run_translate(runner: Any) -> None:
    """Every (mode, B): each system's rounds, then one record per system."""
    args = runner.args
    systems = [("ours", dtype) for dtype in args.dtypes] + peers(args.framework, args.dtypes)
    for mode in ("greedy", "beam"):
        for B in args.translate_batches:
            rounds = [[_worker(args, system, dtype, mode, B) for system, dtype in systems]
                      for _ in range(args.translate_rounds)]
            ours = {dtype: rounds[0][i]["translations"] for i, (system, dtype) in enumerate(systems)
                    if system == "ours"}
            for i, (system, dtype) in enumerate(systems):
                reference = ours.get(dtype, ours.get("float32"))
                _record(runner, mode, B, system, dtype, [r[i] for r in rounds], reference)


def _worker(args: Any, system: str, dtype: str, mode: str, B: int) -> dict[str, Any]:
    """One ``bench.translate_worker`` process: its JSON result."""
    cmd = [sys.executable, "-m", "bench.translate_worker", "--framework", args.framework, "--system", system,
           "--dtype", dtype, "--config", args.config, "--batch", str(B), "--mode", mode,
           "--repeats", str(args.repeats), "--threads", str(args.threads)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _record(runner: Any, mode: str, B: int, system: str, dtype: str, results: list[dict[str, Any]],
            ours: list[list[int]] | None) -> None:
    """One system's rounds as a record: the median pass of each round, each round's peak memory (the report judges
    them all, ``bench.verdict.judge_peaks``) and their median, and whether its first batch's translations are ours
    (``ours``: in the same dtype, else float32; None when not run)."""
    per_round = [float(np.median(r["times_s"])) for r in results]
    timing = {"first_s": results[0]["first_s"], "median_s": float(np.median(per_round)), "min_s": min(per_round),
              "max_s": max(per_round), "repeats": sum(len(r["times_s"]) for r in results)}
    tokens = results[0]["tokens"]
    dims = {"B": B, "sentences": tc.sentence_count(B), "new_tokens": tc.NEW_TOKENS,
            "beam_size": 1 if mode == "greedy" else tc.BEAM_SIZE}
    peaks = [r["peak_rss_mb"] for r in results]
    metrics = {"tokens_per_s": tokens / timing["median_s"], "peak_rss_mb": float(np.median(peaks)),
               "framework_rss_mb": results[0]["framework_rss_mb"]}
    runner.record(f"translate_{mode}", results[0]["subject"], dtype, dims, timing=timing, times_s=per_round,
                  metrics=metrics, peak_rss_runs_mb=peaks, system=system,
                  same_translations_as_ours=None if ours is None else results[0]["translations"] == ours)
