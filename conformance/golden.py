"""Loading golden cases (``spec/golden``) and judging a backend's tensors against them."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path

import numpy as np
import safetensors.numpy

from spec import golden_cases, tolerance
from spec.config import Config


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    meta: dict
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]
    faithful: dict[str, np.ndarray]  # the faithful reference's values at bf16 rounding points ({} if not stored)
    params: dict[str, np.ndarray]    # trained weights ({} where they are regenerated from a seed)

    @property
    def kind(self) -> str:
        return self.meta["kind"]

    @property
    def config(self) -> Config:
        return Config.from_dict(self.meta["config"])

    def faithful_error(self, tensor: str) -> tolerance.ErrorStats:
        return tolerance.ErrorStats(**self.meta["tensors"][tensor])


def load_case(d: Path) -> Case:
    """Read one case folder, verifying each file's sha256 against ``meta.json``.

    Raises:
        ValueError: naming the file whose hash differs.
    """
    meta = json.loads((d / "meta.json").read_text())
    for fname, digest in meta["sha256"].items():
        if hashlib.sha256((d / fname).read_bytes()).hexdigest() != digest:
            raise ValueError(f"{d / fname}: sha256 differs from meta.json")
    load = lambda f: safetensors.numpy.load_file(str(d / f)) if (d / f).exists() else {}  # noqa: E731
    return Case(d.name, meta, load("inputs.safetensors"), load("expected.safetensors"), load("faithful.safetensors"),
                load("params.safetensors"))


@functools.cache
def all_cases(root: Path = golden_cases.GOLDEN_DIR) -> tuple[Case, ...]:
    return tuple(load_case(d) for d in sorted(root.iterdir()) if (d / "meta.json").exists())


def cases(kind: str) -> list[Case]:
    return [c for c in all_cases() if c.kind == kind]


def judge_tensor(case: Case, name: str, recorded: dict[str, np.ndarray], ids: dict[str, np.ndarray]
                 ) -> tolerance.Verdict:
    """Judge one stored tensor of a case against the backend's ``recorded`` tensors: the part the case
    stores (``spec.golden_cases.checked_part``), at non-pad positions only."""
    exact = case.expected[name]
    a = golden_cases.checked_part(name, recorded, case.meta.get("sampling", {})).astype(np.float64)
    if a.shape != exact.shape:
        raise AssertionError(f"{case.name}/{name}: shape {a.shape}, expected {exact.shape}")
    pid = ids.get(golden_cases.positions_of(name))
    pad = case.config.pad_id
    a, x = golden_cases.valid_rows(a, pid, pad), golden_cases.valid_rows(exact, pid, pad)
    if name == "pe":
        return tolerance.judge_positional_encoding(a, x)
    return tolerance.judge(a, x, case.faithful_error(name))
