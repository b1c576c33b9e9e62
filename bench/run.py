"""Time one framework: its impl and its stock peer on the bench's workloads; write ``bench-<framework>.json``.

    python -m bench.run --framework torch --out reports/bench [--workloads forward,greedy] ...

One process per framework (each in the environment of its own framework only); ``bench.report``
merges the files. Workloads (``--workloads``, default all):

- ``matmul``: the framework's own (M, K, N) product rate in fp32 and bf16, the denominators of utilisation.
- ``forward``: teacher-forced forward (B, S) x (B, T) -> logits, ours and the peer, each dtype.
- ``greedy``: the library's greedy_search; the per-step cost with the KV cache up to the last new token, and
  without it (prefix recomputed) over the first new tokens; ours, each dtype.
- ``beam``: the library's beam_search, beam 4, as many new tokens as greedy's short run; ours, each dtype.
- ``train``: our ``train_step`` (forward, backward, Adam) and the peer's own training step, mixed precision and
  fp32; 3x forward FLOPs.
- ``scaling``: forward at S = T in ``--lengths``, ours and the peer, the first dtype; the fitted exponent.
- ``lm``: the decoder-only ``LanguageModel`` beside the framework's stock GPT-2 at ``--lm-size``: prefill, decode
  steps and greedy generation at each ``--lm-batches`` B (``bench.lm_run``).
- ``translate``: sentences of 10-40 tokens translated greedily and with beam 4 at each ``--translate-batches`` B,
  ours and (torch) Hugging Face's Marian and CTranslate2 on the same weights, each system in its own process with
  its peak memory (``bench.translate_run``).
- ``paper_batch``: the bf16 forward and the mixed training step of ours from B = 8 to the paper's batch (25,000
  source + 25,000 target tokens), each in its own process: time, tokens/s, share of the GEMM rate, peak memory
  (``bench.paper_batch``).
- ``memory``: the peak resident memory of the forward, greedy, beam and training step, ours and (forward, train)
  the peer, each subject in ``--memory-runs`` processes of its own (``bench.memory``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
from pathlib import Path
from typing import Any

from rich.console import Console

import spec
from bench import verdict
from bench.common import bench_params, fit_exponent, inputs, machine, measure, measure_together, targets
from bench.decoding_run import run_beam, run_greedy
from bench.lm_common import LM_SIZES
from bench.lm_run import run_lm
from bench.memory import run_memory
from bench.paper_batch import run_paper_batch
from bench.translate_run import run_translate
from spec.api import BACKENDS
from spec.flops import forward_flops, train_step_flops

WORKLOADS = ("matmul", "forward", "greedy", "beam", "train", "scaling", "lm", "translate", "paper_batch", "memory")
console = Console(stderr=True)


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    fw = importlib.import_module(f"bench.bench_{args.framework}")
    env = {"framework": args.framework, "device": args.device, "machine": machine(), **fw.setup(args.device)}
    records: list[dict[str, Any]] = []
    run = Runner(args, fw, records)
    # The product rate once more at the end: a rate read during a transient at the start of a process (measured
    # once at 95 GFLOP/s against 204 alone) would inflate every utilisation; the report keeps the higher one.
    again = ["matmul"] if "matmul" in args.workloads and len(args.workloads) > 1 else []
    for workload in [*args.workloads, *again]:
        with console.status(f"[bold]{args.framework}[/] {workload}"):
            getattr(run, workload)()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"bench-{args.framework}.json"
    options = {k: v for k, v in vars(args).items() if k not in ("out",)}
    path.write_text(json.dumps({"environment": env, "options": options, "records": records}, indent=1))
    console.print(f"wrote {path}")


class Runner:
    """The workloads of one framework; each appends records and prints one line per figure."""

    def __init__(self, args: argparse.Namespace, fw: Any, records: list[dict[str, Any]]):
        self.args, self.fw, self.records = args, fw, records
        self.configs = {dt: spec.preset(args.config, dtype=dt, param_dtype=dt) for dt in args.dtypes}
        self._ours: dict[str, Any] = {}

    def ours(self, dtype: str) -> Any:
        """Our impl in ``dtype``, built once per dtype from the bench weights (``bench_params``)."""
        if dtype not in self._ours:
            config = self.configs[dtype]
            self._ours[dtype] = self.fw.ours(config, bench_params(config), self.args.device)
        return self._ours[dtype]

    def record(self, workload: str, subject: str, dtype: str, dims: dict[str, int], **fields: Any) -> None:
        rec = {"framework": self.args.framework, "workload": workload, "subject": subject, "dtype": dtype,
               "dims": dims, **fields}
        self.records.append(rec)
        timing = rec.get("timing")
        figure = f"{timing['median_s'] * 1e3:9.1f} ms (first {timing['first_s']:.1f} s)" if timing else ""
        extra = ", ".join(f"{k} {v:.3g}" for k, v in rec.get("metrics", {}).items())
        console.print(f"{self.args.framework:5} {workload:8} {subject:28} {dtype:8} {figure} {extra}")

    def matmul(self) -> None:
        M, K, N = self.args.matmul
        for dtype in ("float32", "bfloat16"):
            # One product takes milliseconds: more repeats, within a few seconds.
            timing = measure(self.fw.matmul(dtype, self.args.device, M, K, N), max(self.args.repeats, 20), 5.0)
            flops = 2 * M * K * N
            self.record("matmul", self.args.framework, dtype, {"M": M, "K": K, "N": N}, timing=timing.as_dict(),
                        flops=flops, metrics={"flop_per_s": flops / timing.median_s})

    def forward(self) -> None:
        """Ours and the peer in every dtype, their repeats interleaved: the ratios between them are the point."""
        B, S, T = self.args.batch, self.args.src_len, self.args.tgt_len
        self._forwards("forward", [(dtype, peer) for dtype in self.args.dtypes for peer in (False, True)], B, S, T)

    def _forwards(self, workload: str, which: list[tuple[str, bool]], B: int, S: int, T: int) -> list[dict]:
        """Teacher-forced forwards of (dtype, peer?) subjects on the same token ids, timed together."""
        subjects, calls = [], []
        for dtype, peer in which:
            config = self.configs[dtype]
            subject = self.fw.peer(config, self.args.device) if peer else self.ours(dtype)
            src, tgt_in = inputs(config, B, S, T)
            subjects.append(subject)
            calls.append(lambda s=subject, x=src, y=tgt_in: s.forward(x, y))
        records, until = [], verdict.forward_until(which) if workload == "forward" else None
        for subject, timing in zip(subjects, measure_together(calls, self.args.repeats, until=until), strict=True):
            flops = forward_flops(self.configs[subject.dtype], B, S, T)
            self.record(workload, subject.name, subject.dtype, {"B": B, "S": S, "T": T}, timing=timing.as_dict(),
                        flops=flops, metrics={"flop_per_s": flops / timing.median_s,
                                              "tokens_per_s": B * (S + T) / timing.median_s})
            records.append(self.records[-1])
        return records

    def greedy(self) -> None:
        run_greedy(self)

    def beam(self) -> None:
        run_beam(self)

    def train(self) -> None:
        """Our ``train_step`` (forward, backward, Adam; dropout at the paper's 0.1) through the common API, and the
        stock peer's own training step (``peer_trainer``: the framework's idiom, the same hyperparameters, its own
        init, a constant learning rate), in mixed precision (bf16 compute, fp32 master weights) and fp32, on the
        same batch, all timed together; each 3x the forward's FLOPs."""
        B, S, T = self.args.batch, self.args.src_len, self.args.tgt_len
        impl = importlib.import_module(f"impl_{self.args.framework}")

        def step(run: dict[str, Any]) -> None:
            loss, run["model"], run["state"] = impl.train_step(run["model"], run["state"], *run["batch"])
            float(loss)                                                     # waits for the device

        subjects, calls = [], []
        for dtype in self.args.dtypes:
            config = spec.preset(self.args.config, dtype=dtype, param_dtype="float32")
            model = self.fw.ours(config, bench_params(config), self.args.device).model
            src, tgt_in = inputs(config, B, S, T)
            tgt_out = targets(config, tgt_in)  # (B, T)
            run = {"model": model, "state": impl.init_train_state(model), "batch": (src, tgt_in, tgt_out)}
            peer = self.fw.peer_trainer(config, self.args.device)
            subjects += [(f"impl_{self.args.framework}", config), (peer.name, config)]
            calls += [lambda r=run: step(r), lambda p=peer, b=run["batch"]: p.step(*b)]
        ours = [i for i, (name, _) in enumerate(subjects) if name.startswith("impl_")]
        until = verdict.versus(ours[0], [ours[0] + 1])          # the first dtype's step against the peer's
        for (name, config), timing in zip(subjects, measure_together(calls, self.args.repeats, until=until),
                                          strict=True):
            flops = train_step_flops(config, B, S, T)
            self.record("train", name, config.dtype, {"B": B, "S": S, "T": T}, timing=timing.as_dict(), flops=flops,
                        param_dtype=config.param_dtype,
                        metrics={"flop_per_s": flops / timing.median_s, "tokens_per_s": B * (S + T) / timing.median_s})

    def scaling(self) -> None:
        """Ours and the peer in the first dtype at each S = T; the exponent fitted per subject."""
        dtype, B = self.args.dtypes[0], self.args.batch
        runs = [r for L in self.args.lengths for r in self._forwards("scaling", [(dtype, False), (dtype, True)],
                                                                     B, L, L)]
        for name in dict.fromkeys(r["subject"] for r in runs):
            mine = [r for r in runs if r["subject"] == name]
            exponent = fit_exponent([r["dims"]["S"] for r in mine], [r["timing"]["median_s"] for r in mine])
            for r in mine:
                r["metrics"]["exponent"] = exponent
            console.print(f"{self.args.framework:5} scaling  {name:28} time ~ L^{exponent:.2f}")

    def lm(self) -> None:
        run_lm(self)

    def translate(self) -> None:
        run_translate(self)

    def paper_batch(self) -> None:
        run_paper_batch(self)

    def memory(self) -> None:
        run_memory(self)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bench.run``."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--framework", required=True, choices=BACKENDS)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--out", default="reports/bench")
    p.add_argument("--workloads", type=lambda s: s.split(","), default=list(WORKLOADS))
    p.add_argument("--config", default="base", choices=sorted(spec.config.PRESETS))
    p.add_argument("--dtypes", type=lambda s: s.split(","), default=["bfloat16", "float32"])
    p.add_argument("--batch", type=int, default=8, help="B")
    p.add_argument("--src-len", type=int, default=64, help="S")
    p.add_argument("--tgt-len", type=int, default=64, help="T")
    p.add_argument("--new-tokens", type=_ints, default=[32, 128], help="short,long: greedy/beam and cached steps")
    p.add_argument("--lengths", type=_ints, default=[32, 64, 128, 256], help="S = T for the scaling workload")
    p.add_argument("--matmul", type=_ints, default=[512, 512, 2048], help="M,K,N of the rate product")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--lm-size", default="gpt2_small", choices=sorted(LM_SIZES), help="the lm workload's model size")
    p.add_argument("--lm-batches", type=_ints, default=[1, 16], help="B of the lm workload")
    p.add_argument("--lm-prompt", type=int, default=512, help="L: prompt tokens; decode is measured at context L")
    p.add_argument("--lm-short", type=int, default=32, help="the short context of the decode-step comparison")
    p.add_argument("--lm-steps", type=int, default=8, help="decode steps timed at each context")
    p.add_argument("--lm-new-tokens", type=int, default=32, help="new tokens of the lm generation")
    p.add_argument("--paper-forward-batches", type=_ints, default=[8, 64, 390], help="B of the paper_batch forward")
    p.add_argument("--paper-train-batches", type=_ints, default=[8, 16, 32], help="B of the paper_batch step")
    p.add_argument("--translate-batches", type=_ints, default=[1, 32], help="B of the translate workload")
    p.add_argument("--translate-rounds", type=int, default=verdict.MIN_ROUNDS,
                   help="processes per system of the translate workload")
    p.add_argument("--memory-runs", type=int, default=verdict.MIN_RUNS,
                   help="processes per subject of the memory workload")
    p.add_argument("--threads", type=int, default=os.cpu_count(),
                   help="intra-op threads of torch and CTranslate2 in the translate and memory workloads' processes")
    return p


if __name__ == "__main__":
    main()
