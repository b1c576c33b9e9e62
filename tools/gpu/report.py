"""The GPU run's report: ``gpu-run.json`` (everything) and ``gpu-run.md`` (the environment, every step's outcome,
the speed table with the share of peak, the decoding figures)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write(report: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """Write ``report`` as ``out/gpu-run.json`` and ``out/gpu-run.md``; their paths."""
    j, m = out / "gpu-run.json", out / "gpu-run.md"
    j.write_text(json.dumps(report, indent=1))
    m.write_text(markdown(report))
    return j, m


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown."""
    env, opts = report["environment"], report["options"]
    lines = [f"# GPU run: {env['device_name']}, {opts['size']} sizes", "",
             f"{env['date']}; device {opts['device']} ({env['device_name']}); CPU {env['cpu']}; "
             f"Python {env['python']}; " + "; ".join(f"{k} {v}" for k, v in env["versions"].items())
             + f"; budget {opts['budget_s']:g} s.", "",
             "## Steps", "", "| part | step | outcome | seconds | why / checks |", "|---|---|---|---:|---|"]
    for s in report["steps"]:
        lines.append(f"| {s['part']} | {s['name']} | {s['status']} | {s['seconds'] if s['seconds'] is not None else ''}"
                     f" | {_why(s)} |")
    lines += ["", "## Forward and mixed training step (bf16)", "", report["peak"]["note"] + ".", "",
              "| framework | config | workload | subject | B, S, T | ms | TFLOP/s | share of peak |",
              "|---|---|---|---|---|---:|---:|---:|"]
    for r in report["speed"]:
        share = "" if r["share_of_peak"] is None else f"{100 * r['share_of_peak']:.1f}%"
        dims = ", ".join(str(r["dims"][k]) for k in ("B", "S", "T"))
        lines.append(f"| {r['framework']} | {r['config']} | {r['workload']} | {r['subject']} | {dims} | "
                     f"{r['median_s'] * 1e3:.2f} | {r['tflop_per_s']:.3g} | {share} |")
    lines += ["", "## Decoding", "", "| framework | workload | subject | B | ms | tokens/s |",
              "|---|---|---|---:|---:|---:|"]
    lines += [f"| {r['framework']} | {r['workload']} | {r['subject']} | {r['B']} | {r['median_s'] * 1e3:.2f} | "
              f"{r['tokens_per_s']:.4g} |" for r in report["decode"]]
    return "\n".join(lines) + "\n"


def _why(step: dict[str, Any]) -> str:
    """A step's reason on one line, or its checks' outcomes."""
    checks, said = step.get("checks"), []
    if checks:
        outcomes = ", ".join(f"{n} {k}" for k, n in sorted(checks["outcomes"].items()))
        said.append(f"{checks['reached']} of {checks['collected']} checks reached: {outcomes}")
    if step["reason"]:
        said.append(step["reason"].replace("\n", " ").replace("|", "/")[-300:])
    return "; ".join(said)
