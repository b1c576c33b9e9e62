"""Achieved TFLOP/s of the bench's records and their share of the chip's dense bf16 peak.

FLOPs are ``spec.flops``' (matrix products only, 2 per multiply-add; a training step 3x the forward), as
``bench.run`` records them; the peaks are the vendors' dense (not sparse) bf16 tensor-core figures, the bench
report's own table.
"""

from __future__ import annotations

from typing import Any

from bench.report import GPU_PEAK_BF16


def peak_bf16(device_name: str) -> tuple[float | None, str]:
    """(the dense bf16 peak in TFLOP/s from ``bench.report.GPU_PEAK_BF16``, None when unknown; how it was found)."""
    for key, peak in GPU_PEAK_BF16.items():
        if key.lower() in device_name.lower():
            return peak / 1e12, f"{key}: {peak / 1e12:g} TFLOP/s dense bf16"
    return None, f"no known dense bf16 peak for {device_name!r}: the share of peak is omitted"


def rows(records: list[dict[str, Any]], peak: float | None) -> list[dict[str, Any]]:
    """One row per timed record of ``bench.run`` (forward, train): subject, dims, median seconds, TFLOP/s and
    (with a known ``peak``) its share."""
    out = []
    for r in records:
        if "flops" not in r or "timing" not in r:
            continue
        tflops = r["flops"] / r["timing"]["median_s"] / 1e12
        out.append({"framework": r["framework"], "config": r.get("config"), "workload": r["workload"],
                    "subject": r["subject"], "dtype": r["dtype"],
                    "param_dtype": r.get("param_dtype", r["dtype"]), "dims": r["dims"],
                    "median_s": r["timing"]["median_s"], "tflop_per_s": tflops,
                    "share_of_peak": None if peak is None else tflops / peak})
    return out
