"""Reading a training golden case and judging a backend's run of it (``spec.golden_training`` writes the cases;
``spec.tolerance`` holds the training policy)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import safetensors.numpy

from spec import golden_cases, tolerance
from spec.config import Config
from spec.errors import ErrorStats


def load_case(root, name: str) -> tuple[dict, Config, dict, dict, dict]:
    """A training case from folder ``root``: (meta, config, weights checked against their sha256, inputs,
    expected)."""
    d = Path(root) / name
    meta = json.loads((d / "meta.json").read_text())
    c, params = golden_cases.case_params(meta)
    return (meta, c, params, safetensors.numpy.load_file(str(d / "inputs.safetensors")),
            safetensors.numpy.load_file(str(d / "expected.safetensors")))


def judge(meta: dict, exact: dict, undecided: dict, result: dict) -> dict[str, tolerance.Verdict]:
    """Judge a backend's run of a training case by ``spec.tolerance``'s training policy, on whole tensors.

    ``exact`` and ``undecided``: from ``spec.golden_training.runs`` (live; ``stored`` of them is what the case
    holds). ``result``: {"loss": (STEPS,) losses before each step, "grad": {name: gradient at the initial weights},
    "params_1" and f"params_{STEPS}": {name: weights after that step}}.
    Returns {tensor name as meta["tensors"] has it: Verdict}.
    """
    dtype = meta["config"]["dtype"]
    stats = {k: ErrorStats(**{f: v[f] for f in ("max_abs", "max_eps", "rms_eps", "scale", "unit")})
             for k, v in meta["tensors"].items()}
    out = {"loss": tolerance.judge_gradient(np.asarray(result["loss"]), exact["loss"], stats["loss"])}
    for key in stats:
        group, _, name = key.partition(".")
        if group == "grad":
            out[key] = tolerance.judge_gradient(result["grad"][name], exact["grad"][name], stats[key])
        elif group.startswith("params_"):
            step = int(group.removeprefix("params_"))
            out[key] = tolerance.judge_update(result[group][name], exact[group][name], stats[key], dtype,
                                              undecided[step][name])
    return out
