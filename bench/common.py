"""What every framework's bench shares: inputs, weights, the training hyper-parameters, the clock, peak memory, the
statistics and the record format.

Framework-neutral (NumPy only). A framework module (``bench_torch``, ``bench_jax``, ``bench_tf``) builds
``Subject``s, its own impl and its framework's stock peer, and the peer's ``Trainer``; ``bench.run``
times them here.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

import spec
from bench.verdict import MAX_ROUNDS, MIN_ROUNDS
from spec.config import Config
from spec.training import TrainConfig, learning_rate

TRAIN = TrainConfig()  # the paper's training hyper-parameters, ours (``train_step``'s default) and the peers'

clock = time.perf_counter  # seconds; a subject synchronises its device before returning, so reads are honest


def rss_mb() -> float:
    """The process's peak resident memory so far, MiB: Linux's ``VmHWM``, which starts afresh at ``exec``.
    (``ru_maxrss`` does not: a worker started by a large bench process would report that process's size.)"""
    status = Path("/proc/self/status")
    if status.exists():
        line = next(line for line in status.read_text().splitlines() if line.startswith("VmHWM:"))
        return int(line.split()[1]) / 1024                                  # kB
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024       # bytes on macOS, KiB elsewhere


def machine() -> dict[str, Any]:
    """The machine a record was made on: CPU model, cores, memory (GiB), the SIMD extensions the kernels use,
    Python, OS and the date; every report's and chart's footnote names it."""
    info = _cpuinfo()
    cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")),
               platform.processor() or "unknown CPU")
    flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
    simd = [f for f in flags if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16")]
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(memory_gib, 1), "simd": simd,
            "python": platform.python_version(), "os": platform.platform(), "date": datetime.date.today().isoformat()}


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def bench_params(config: Config, seed: int = 0) -> dict[str, np.ndarray]:
    """``spec.init_params(config, seed)`` with the EOS row of the shared embedding zeroed.

    The EOS logit is then exactly 0 while the largest of the other V - 1 logits is positive, so no greedy or
    beam hypothesis ever ends: every search runs ``max_new_tokens`` steps, the same count in every backend.
    """
    params = spec.init_params(config, seed)
    params["embedding"][config.eos_id] = 0
    return params


def peer_learning_rate(config: Config) -> float:
    """The stock peers' constant Adam learning rate: the peak of equation 3 (its value at step = warmup_steps).
    Ours follows the schedule; a step's cost does not depend on the value."""
    return learning_rate(TRAIN.warmup_steps, config.d_model, TRAIN.warmup_steps)


def inputs(config: Config, B: int, S: int, T: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """src (B, S) and tgt_in (B, T) int64: ordinary tokens (no pad, BOS or EOS), tgt_in starting with BOS."""
    rng = np.random.default_rng(seed)
    low = 1 + max(config.pad_id, config.bos_id, config.eos_id)
    src = rng.integers(low, config.vocab_size, (B, S))
    tgt_in = rng.integers(low, config.vocab_size, (B, T))
    tgt_in[:, 0] = config.bos_id
    return src, tgt_in


def targets(config: Config, tgt_in: np.ndarray) -> np.ndarray:
    """tgt_out (B, T) int64 for teacher forcing on ``tgt_in``: its tokens shifted left, EOS last."""
    return np.concatenate([tgt_in[:, 1:], np.full((len(tgt_in), 1), config.eos_id)], axis=1)


class Subject(Protocol):
    """One model to time: our impl or a framework's stock Transformer. Every method returns only once the
    device has finished (``torch.cuda.synchronize``, ``block_until_ready``, ``.numpy()``)."""

    name: str   # "impl_torch", "torch.nn.Transformer", ...
    dtype: str  # "bfloat16" or "float32": the activations' dtype

    def forward(self, src: np.ndarray, tgt_in: np.ndarray) -> None:
        """Teacher-forced forward to logits (B, T, V) float32."""


class Trainer(Protocol):
    """A stock peer's own training step (``peer_trainer``): fp32 master weights, compute in ``dtype``."""

    name: str
    dtype: str

    def step(self, src: np.ndarray, tgt_in: np.ndarray, tgt_out: np.ndarray) -> None:
        """One step: teacher-forced forward with dropout ``config.dropout`` (training mode), the label-smoothed
        (``TRAIN.label_smoothing``) cross-entropy in fp32 averaged over the non-pad targets, backward, Adam
        (``TRAIN``'s betas and eps, ``peer_learning_rate``); returns once the loss is on the host."""


class Generator(Subject, Protocol):
    """A subject that also decodes (our impls: ``spec.api``)."""

    def greedy(self, src: np.ndarray, max_new_tokens: int) -> np.ndarray:
        """The library's ``greedy_search``: tokens (B, L) int64."""

    def beam(self, src: np.ndarray, max_new_tokens: int, beam_size: int) -> np.ndarray:
        """The library's ``beam_search`` with alpha 0.6: tokens (B, L) int64."""

    def cached_steps(self, src: np.ndarray, n: int) -> list[float]:
        """Seconds of each of n greedy steps with the KV cache (``encode``, ``init_cache`` of capacity n, then
        ``decode`` one token and argmax, n times), each step synchronised; encode and init_cache untimed."""

    def recomputed_steps(self, src: np.ndarray, n: int) -> list[float]:
        """Seconds of each of n greedy steps without a cache: step t runs ``model(src, prefix)`` on the t
        tokens so far and takes the argmax of the last position, as a user without a KV cache would."""


@dataclasses.dataclass
class Timing:
    """Wall-clock seconds: the first call (compilation included) apart from the repeats after it."""

    first_s: float
    times_s: list[float]

    @property
    def median_s(self) -> float:
        return float(np.median(self.times_s))

    def as_dict(self) -> dict[str, Any]:
        t = np.asarray(self.times_s)
        return {"first_s": self.first_s, "median_s": float(np.median(t)), "min_s": float(t.min()),
                "max_s": float(t.max()), "repeats": len(t), "times_s": [float(x) for x in t]}


def measure(fn: Callable[[], Any], repeats: int, budget_s: float = 60.0) -> Timing:
    """``measure_together`` of one function."""
    return measure_together([fn], repeats, budget_s)[0]


def measure_together(fns: list[Callable[[], Any]], repeats: int, budget_s: float = 60.0,
                     until: Callable[[list[list[float]]], bool] | None = None) -> list[Timing]:
    """Time functions that are to be compared, their repeats interleaved round-robin, so that drift of the
    machine (clock, cache, another process) weighs on each alike and their ratio holds.

    Each is called once first (its time is ``first_s``: compilation and the first run) and once more untimed
    (the first runs after compiling are slower: allocation, page faults); then up to ``repeats`` rounds, stopping
    early once ``budget_s`` has passed but not before the rounds a verdict needs (``bench.verdict.MIN_ROUNDS``).
    With ``until`` (the seconds of each function's rounds so far -> whether every verdict they feed is decided,
    ``bench.verdict.decided``), rounds go on until it holds, up to ``bench.verdict.MAX_ROUNDS``.
    """
    first = []
    for fn in fns:
        start = clock()
        fn()
        first.append(clock() - start)
        fn()
    times: list[list[float]] = [[] for _ in fns]
    spent = 0.0
    while (len(times[0]) < repeats and (len(times[0]) < MIN_ROUNDS or spent < budget_s)
           or until is not None and len(times[0]) < MAX_ROUNDS and not until(times)):
        for fn, mine in zip(fns, times, strict=True):
            start = clock()
            fn()
            mine.append(clock() - start)
            spent += mine[-1]
    return [Timing(f, t) for f, t in zip(first, times, strict=True)]


def fit_exponent(sizes: list[int], seconds: list[float]) -> float:
    """The least-squares slope of log(seconds) against log(size): cost grows as size ** slope."""
    return float(np.polyfit(np.log(sizes), np.log(seconds), 1)[0])


def window_median(step_s: list[float], token: int, width: int = 8) -> float:
    """Median seconds of the ``width`` steps ending at 1-based ``token`` (robust to one slow step)."""
    return float(np.median(step_s[max(0, token - width):token]))
