"""Data-parallel scaling on paper: the step time and efficiency of ``base`` on G GPUs with NVLink.

    python -m bench.scaling_model [--gpus 8] [--utilisation 0.3,0.5] [--bus-gb-per-s 450]

The model, per optimizer step, weak scaling (each GPU keeps its share of the batch; B sentence pairs of S source
and T target tokens per GPU):

- compute: ``t_c = spec.flops.train_step_flops(base, B, S, T) / (u * peak)``, the backward two thirds of it;
  u the fraction of the dense bf16 peak (989 TFLOP/s for H100 SXM) a framework reaches. No GPU has measured u
  here yet (``nox -s bench -- --device cuda --workloads train`` does, where a GPU is lent), so it is a parameter.
- all-reduce: the fp32 gradient of every parameter (4 bytes each; ``spec.schema``), by a ring, each GPU sending and
  receiving ``2 (G - 1) / G`` of it at the bus bandwidth: ``t_ar``. 450 GB/s is NVLink 4's one-way bandwidth per
  GPU; nccl-tests' ``all_reduce_perf`` reports a bus bandwidth of 460-480 GB/s for large messages on 8 x H100 SXM.
- without overlap the step takes ``t_c + t_ar`` (the gradient is reduced after the backward, in one or a few
  packs: ``tf.distribute.MirroredStrategy``'s ``NcclAllReduce``); with the all-reduce of each bucket overlapped with
  the rest of the backward (``DistributedDataParallel``'s 25 MB buckets; XLA's latency-hiding scheduler under
  ``jax.jit``, where it schedules it so), ``t_c + max(t_ar - t_backward, 0) + t_ar * bucket / gradient``: only the
  last bucket's reduction stays exposed.

Efficiency is ``t_c / t_step``: the fraction of a single GPU's throughput each GPU keeps.
"""

from __future__ import annotations

import argparse

import numpy as np

from spec import schema
from spec.config import BASE, Config
from spec.flops import train_step_flops

PEAK_FLOP_PER_S = 989e12  # H100 SXM dense bf16 (the datasheet's 1979 is with 2:4 sparsity)
BUCKET_BYTES = 25 * 2 ** 20  # DistributedDataParallel's default bucket_cap_mb


def gradient_bytes(c: Config) -> int:
    """The fp32 gradient of every parameter, in bytes: 63,045,632 values (252 MB) for ``base``."""
    return 4 * sum(int(np.prod(s.shape)) for s in schema.param_specs(c))


def step(c: Config, B: int, S: int, T: int, gpus: int, utilisation: float, bus_bytes_per_s: float) -> dict:
    """The model above for one per-GPU batch: seconds of compute, all-reduce and step, and the efficiency, without
    and with overlap."""
    t_c = train_step_flops(c, B, S, T) / (utilisation * PEAK_FLOP_PER_S)
    size = gradient_bytes(c)
    t_ar = 2 * (gpus - 1) / gpus * size / bus_bytes_per_s
    serial = t_c + t_ar
    overlapped = t_c + max(t_ar - 2 / 3 * t_c, 0.0) + t_ar * min(BUCKET_BYTES / size, 1.0)
    return {"t_c": t_c, "t_ar": t_ar, "serial": serial, "overlapped": overlapped,
            "eff_serial": t_c / serial, "eff_overlapped": t_c / overlapped}


def table(gpus: int, utilisations: list[float], bus_bytes_per_s: float) -> str:
    """Markdown: the paper's batch split over ``gpus`` (about 25,000 + 25,000 tokens per step, sentences of 25
    tokens), the same per GPU, and the per-GPU batch below which a step without overlap falls under 90%."""
    rows = ["| tokens per GPU (src + tgt) | u | compute ms | all-reduce ms | step ms, no overlap | efficiency | "
            "step ms, overlapped | efficiency |", "|---|---|---|---|---|---|---|---|"]
    for B in (1000 // gpus, 1000):
        for u in utilisations:
            r = step(BASE, B, 25, 25, gpus, u, bus_bytes_per_s)
            rows.append(f"| {B * 50:,} | {u:.0%} | {r['t_c'] * 1e3:.1f} | {r['t_ar'] * 1e3:.2f} | "
                        f"{r['serial'] * 1e3:.1f} | {r['eff_serial']:.0%} | {r['overlapped'] * 1e3:.1f} | "
                        f"{r['eff_overlapped']:.0%} |")
    need = [min(B for B in range(1, 5000) if step(BASE, B, 25, 25, gpus, u, bus_bytes_per_s)["eff_serial"] >= 0.9)
            for u in utilisations]
    above = ", ".join(f"{B * 50:,} tokens per GPU at u = {u:.0%}" for B, u in zip(need, utilisations, strict=True))
    size = gradient_bytes(BASE)
    rows += ["", f"Without overlap a step stays above 90% from {above}; the gradient is {size:,} bytes "
             f"({size // 4:,} fp32 values), {gpus} GPUs, {bus_bytes_per_s / 1e9:.0f} GB/s."]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--utilisation", type=lambda s: [float(x) for x in s.split(",")], default=[0.3, 0.5],
                   help="fractions of the bf16 peak a training step reaches")
    p.add_argument("--bus-gb-per-s", type=float, default=450.0, help="all-reduce bus bandwidth, GB/s")
    args = p.parse_args(argv)
    print(table(args.gpus, args.utilisation, args.bus_gb_per_s * 1e9))


if __name__ == "__main__":
    main()
