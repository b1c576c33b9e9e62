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
# tiny: one process per system (each mode takes the same path through this module; greedy is the cheaper)
TRANSLATE_MODES = {"full": ("greedy", "beam"), "tiny": ("greedy",)}
TINY_SKIPS_PEER = ("not run at --size tiny: the smoke run translates with ours only (the peer's path through this "
                   "module is the same, and its process the costliest of the run); generation meets transformers")
LM = {"full": ["--lm-size", "gpt2_small", "--lm-batches", "1,32"],
      "tiny": ["--lm-size", "lm_tiny", "--lm-batches", "2", "--lm-prompt", "8", "--lm-short", "4", "--lm-steps", "2",
               "--lm-new-tokens", "4"]}
# What a framework's bench process imports beyond the framework: its stock peer (torch's is its own nn.Transformer).
NEEDS = {"torch": ("torch",), "jax": ("jax", "flax", "optax")}


def frameworks(size: str) -> dict[str, list[str]]:
    """The frameworks each part runs, in order: jax first where the suite runs (the longer, its compilation cache
    then warm for a rerun). At ``tiny`` the suite runs in jax only and decoding in torch only: the other framework
    would take the same path through this module, and the CPU's run is to stay short."""
    full = size == "full"
    return {"conformance": ["jax", "torch"] if full else ["jax"], "bench": ["torch", "jax"],
            "decode": ["torch", "jax"] if full else ["torch"]}


def conformance(part: Part, size: str) -> None:
    """The whole suite for each backend (at ``tiny``: ``TINY_CHECKS``), jax given four times torch's time; the
    checks' outcomes from its report."""
    only = ["--", "-k", TINY_CHECKS] if size == "tiny" else []
    folder = part.out / "conformance"
    for old in folder.glob("conformance-*"):  # an earlier run's reports would pass for this one's
        old.unlink()
    part.run_all([(fw, missing(fw) or ["-m", "tools.conformance", "--report-dir", str(folder), "--jobs", "1", fw,
                                       *only], 4.0 if fw == "jax" else 1.0)
                  for fw in frameworks(size)["conformance"]])
    for rec in part.records:
        rec["checks"] = _checks(folder, rec["name"])  # a stopped run's too: the checks it reached


def _checks(folder: Path, backend: str) -> dict[str, Any] | None:
    """The outcome counts of the backend's report (the whole suite's or a filtered one's), None without one."""
    reports = sorted(folder.glob(f"conformance-{backend}*.json"), key=lambda p: p.stat().st_mtime)
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
    the records of every ``bench.run`` that ran, each with its preset (``config``)."""
    plan = []
    for fw in frameworks(size)["bench"]:
        for config, (B, S, T) in BENCH[size].items():
            name = f"{fw}-{config}"
            plan.append((name, missing(*NEEDS[fw]) or [
                "-m", "bench.run", "--framework", fw, "--device", device, "--out", str(part.out / "bench" / name),
                "--workloads", "forward,train", "--config", config, "--dtypes", "bfloat16", "--batch", str(B),
                "--src-len", str(S), "--tgt-len", str(T), "--repeats", str(REPEATS[size])], 1.0))
    records = []
    for rec in part.run_all(plan):
        if rec["status"] == RAN:
            fw, config = rec["name"].split("-", 1)
            done = json.loads((part.out / "bench" / rec["name"] / f"bench-{fw}.json").read_text())["records"]
            records += [{**r, "config": config} for r in done]
    return records


def decode(part: Part, device: str, size: str) -> list[dict[str, Any]]:
    """Translation (greedy and beam at ``full``) at B = 32, ours in each framework and Marian in torch's, then
    generation (``bench.run --workloads lm``) per framework; the results of the steps that ran."""
    plan = []
    for fw, system in [(fw, "ours") for fw in frameworks(size)["decode"]] + [("torch", "transformers")]:
        for mode in TRANSLATE_MODES[size]:
            why = ("bench.translate_worker runs every system on the CPU: it takes no device" if device != "cpu"
                   else TINY_SKIPS_PEER if size == "tiny" and system != "ours"
                   else missing(*NEEDS[fw], *(["transformers"] if system == "transformers" else [])))
            plan.append((f"translate-{mode}-{fw}-{system}", why or [
                "-m", "bench.translate_worker", "--framework", fw, "--system", system, "--dtype", "bfloat16",
                "--config", TRANSLATE_CONFIG[size], "--batch", str(TRANSLATE_B), "--mode", mode,
                "--repeats", str(REPEATS[size])], 1.0))
    for fw in frameworks(size)["decode"]:
        plan.append((f"lm-{fw}", missing(*NEEDS[fw], *(["transformers"] if fw == "torch" else [])) or [
            "-m", "bench.run", "--framework", fw, "--device", device, "--out", str(part.out / "lm" / fw),
            "--workloads", "lm", "--dtypes", "bfloat16", "--repeats", str(REPEATS[size]), *LM[size]], 1.0))
    results = []
    for rec in part.run_all(plan):
        if rec["status"] == RAN and rec["name"].startswith("translate-"):
            _, mode, fw, _ = rec["name"].split("-")
            out = _worker_result((part.out / rec["log"]).read_text())
            median = float(np.median(out["times_s"]))
            results.append({"workload": f"translate_{mode}", "framework": fw, "subject": out["subject"],
                            "B": TRANSLATE_B, "median_s": median, "tokens_per_s": out["tokens"] / median})
        elif rec["status"] == RAN:
            fw = rec["name"].removeprefix("lm-")
            for r in json.loads((part.out / "lm" / fw / f"bench-{fw}.json").read_text())["records"]:
                results.append({"workload": r["workload"], "framework": fw, "subject": r["subject"],
                                "B": r["dims"]["B"], "median_s": r["timing"]["median_s"],
                                "tokens_per_s": r["metrics"]["tokens_per_s"]})
    return results


def _worker_result(log: str) -> dict[str, Any]:
    """The JSON line ``bench.translate_worker`` prints, the last such line of its log (warnings may follow it)."""
    return next(json.loads(line) for line in reversed(log.splitlines()) if line.startswith('{"subject"'))
