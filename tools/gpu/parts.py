"""The GPU run's three parts, each a ``steps.Part`` of processes: the conformance suite (``tools.conformance``), the
bench's forward and mixed training step (``bench.run``), and decoding: translation (``bench.translate_worker``) and
generation (``bench.run --workloads lm``), ours against the peers.

Sizes: ``full`` is the chip's (the bench at about the paper's 25,000 source and 25,000 target tokens a batch,
section 5.1; gpt2_small); ``tiny`` is the CPU's smoke run (the ``tiny`` and ``lm_tiny`` presets, a few checks).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from tools.gpu.steps import RAN, Part, missing

# A few checks that compile little: the suite's reach at ``tiny``, to show the run works, not that the impl does.
TINY_CHECKS = "test_api_names_and_signatures or test_api_from_params_checks"
BENCH = {"full": {"base": (192, 128, 128), "big": (192, 128, 128)}, "tiny": {"tiny": (2, 8, 8)}}  # (B, S, T)
REPEATS = {"full": 10, "tiny": 1}
TRANSLATE_CONFIG, TRANSLATE_B = {"full": "base", "tiny": "tiny"}, 32
# tiny: one process per system (each mode takes the same path through this module)
TRANSLATE_MODES = {"full": ("greedy", "beam"), "tiny": ("beam",)}
LM = {"full": ["--lm-size", "gpt2_small", "--lm-batches", "1,32"],
      "tiny": ["--lm-size", "lm_tiny", "--lm-batches", "2", "--lm-prompt", "8", "--lm-short", "4", "--lm-steps", "2",
               "--lm-new-tokens", "4"]}
# What a framework's bench process imports beyond the framework: its stock peer (torch's is its own nn.Transformer).
NEEDS = {"torch": ("torch",), "jax": ("jax", "flax", "optax")}


def frameworks(size: str) -> dict[str, list[str]]:
    """The frameworks each part runs, in order: jax first where the suite runs (the longer, its compilation cache
    then warm for a rerun); translation and generation in jax only at ``full``, to keep the CPU's run short."""
    return {"conformance": ["jax", "torch"], "bench": ["torch", "jax"],
            "decode": ["torch", "jax"] if size == "full" else ["torch"]}


def weights(part: str, size: str) -> list[float]:
    """The steps' shares of their part's time, in the order the part runs them."""
    fws = frameworks(size)[part]
    if part == "conformance":
        return [3.0 if fw == "jax" else 1.0 for fw in fws]
    if part == "bench":
        return [1.0] * len(fws) * len(BENCH[size])
    return [1.0] * (len(translate_systems(size)) * len(TRANSLATE_MODES[size]) + len(fws))


def conformance(part: Part, size: str) -> None:
    """The whole suite for each backend (at ``tiny``: ``TINY_CHECKS``); the checks' outcomes from its report."""
    only = ["--", "-k", TINY_CHECKS] if size == "tiny" else []
    for fw in frameworks(size)["conformance"]:
        if why := missing(fw):
            part.skip(fw, why)
            continue
        rec = part.run(fw, ["-m", "tools.conformance", "--report-dir", str(part.out / "conformance"), "--jobs", "1",
                            fw, *only])
        rec["checks"] = _checks(part.out / "conformance", fw)


def _checks(folder: Path, backend: str) -> dict[str, Any] | None:
    """The outcome counts of the backend's report (the whole suite's or a filtered one's), None without one."""
    reports = sorted(folder.glob(f"conformance-{backend}*.json"))
    if not reports:
        return None
    report = json.loads(reports[-1].read_text())
    counts: dict[str, int] = {}
    for check in report["checks"].values():
        counts[check["outcome"]] = counts.get(check["outcome"], 0) + 1
    return {"collected": report["collected"], "reached": len(report["checks"]), "outcomes": counts,
            "partial": report.get("partial", False), "report": reports[-1].name}


def bench(part: Part, device: str, size: str) -> list[dict[str, Any]]:
    """The bf16 forward and mixed training step, ours and the framework's stock peer, per framework and preset;
    the records of every ``bench.run`` that ran."""
    records = []
    for fw in frameworks(size)["bench"]:
        for config, (B, S, T) in BENCH[size].items():
            name = f"{fw}-{config}"
            if why := missing(*NEEDS[fw]):
                part.skip(name, why)
                continue
            out = part.out / "bench" / name
            rec = part.run(name, ["-m", "bench.run", "--framework", fw, "--device", device, "--out", str(out),
                                  "--workloads", "forward,train", "--config", config, "--dtypes", "bfloat16",
                                  "--batch", str(B), "--src-len", str(S), "--tgt-len", str(T),
                                  "--repeats", str(REPEATS[size])])
            if rec["status"] == RAN:
                done = json.loads((out / f"bench-{fw}.json").read_text())["records"]
                records += [{**r, "config": config} for r in done]
    return records


def translate_systems(size: str) -> list[tuple[str, str]]:
    """(framework, system) of the translation steps: ours in each framework, Hugging Face's Marian in torch's."""
    return [(fw, "ours") for fw in frameworks(size)["decode"]] + [("torch", "transformers")]


def decode(part: Part, device: str, size: str) -> list[dict[str, Any]]:
    """Translation greedy and beam at B = 32, then generation (``bench.run --workloads lm``) per framework; the
    results of the steps that ran."""
    results = []
    for fw, system in translate_systems(size):
        for mode in TRANSLATE_MODES[size]:
            name = f"translate-{mode}-{fw}-{system}"
            if device != "cpu":
                part.skip(name, "bench.translate_worker runs every system on the CPU: it takes no device")
                continue
            if why := missing(*NEEDS[fw], *(["transformers"] if system == "transformers" else [])):
                part.skip(name, why)
                continue
            rec = part.run(name, ["-m", "bench.translate_worker", "--framework", fw, "--system", system, "--dtype",
                                  "bfloat16", "--config", TRANSLATE_CONFIG[size], "--batch", str(TRANSLATE_B),
                                  "--mode", mode, "--repeats", str(REPEATS[size])])
            if rec["status"] == RAN:
                out = _worker_result((part.out / rec["log"]).read_text())
                median = float(np.median(out["times_s"]))
                results.append({"workload": f"translate_{mode}", "framework": fw, "subject": out["subject"],
                                "B": TRANSLATE_B, "median_s": median, "tokens_per_s": out["tokens"] / median})
    for fw in frameworks(size)["decode"]:
        name = f"lm-{fw}"
        if why := missing(*NEEDS[fw], *(["transformers"] if fw == "torch" else [])):
            part.skip(name, why)
            continue
        out = part.out / "lm" / fw
        rec = part.run(name, ["-m", "bench.run", "--framework", fw, "--device", device, "--out", str(out),
                              "--workloads", "lm", "--dtypes", "bfloat16", "--repeats", str(REPEATS[size]),
                              *LM[size]])
        if rec["status"] == RAN:
            for r in json.loads((out / f"bench-{fw}.json").read_text())["records"]:
                results.append({"workload": r["workload"], "framework": fw, "subject": r["subject"],
                                "B": r["dims"]["B"], "median_s": r["timing"]["median_s"],
                                "tokens_per_s": r["metrics"]["tokens_per_s"]})
    return results


def _worker_result(log: str) -> dict[str, Any]:
    """The JSON line ``bench.translate_worker`` prints, the last such line of its log (warnings may follow it)."""
    return next(json.loads(line) for line in reversed(log.splitlines()) if line.startswith('{"subject"'))
