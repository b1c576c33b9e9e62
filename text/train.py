"""Training a translation model on real sentence pairs through the common API of any backend (section 5).

One step is ``T.train_step(model, state, src, tgt_in, tgt_out)`` on the ``TokenBatches`` batch of that step
(section 5.1: pairs batched by length, about ``tokens_per_batch`` positions per side), so a run is a function of its
options: the same seed gives the same batches in every backend, and a resumed run sees the batches the
uninterrupted one would have. The budget is training time (evaluation excluded) or a step count. Every
``checkpoint_minutes`` of training (or ``checkpoint_steps`` steps) a checkpoint is written (``step-<k>/``: the
weights, the train state and ``progress.json``, renamed into place when complete) and evaluated on the dev set:
the label-smoothed loss without gradients, and BLEU of greedy search on its first ``dev_sentences``. At the end
the last ``average`` checkpoints are averaged (section 6.1) into ``averaged.safetensors``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

import spec
from spec import training, weights_io
from spec.data_parallel import latest_checkpoint
from spec.training import average_params
from text.batching import TokenBatches
from text.evaluate import bleu
from text.tokenizer import Tokenizer
from text.translate import host, translate


@dataclasses.dataclass(frozen=True)
class Options:
    """A training run's settings; ``progress.json`` records them, and ``resume`` refuses other ones."""

    minutes: float | None = 30.0          # training time, evaluation excluded
    max_steps: int | None = None
    tokens_per_batch: int = 2048          # positions per side, B * max(S, T) (section 5.1: ~25000 per side)
    warmup_steps: int = 400
    lr_scale: float = 0.4                 # peak learning rate lr_scale * d_model^-0.5 * warmup_steps^-0.5
    checkpoint_minutes: float = 2.0
    checkpoint_steps: int | None = None   # checkpoint every N steps instead (a run reproducible step for step)
    average: int = 5
    dev_sentences: int = 400
    seed: int = 0
    fill_last: bool = True                # a length group's last batch completed to its rows (text.batching)


# What decides the batches and the arithmetic: a resumed run must keep them.
RESUME_KEYS = ("tokens_per_batch", "warmup_steps", "lr_scale", "seed", "fill_last")


def average_checkpoints(paths: Sequence[str | os.PathLike]) -> tuple[spec.Config, dict[str, np.ndarray]]:
    """``average_params`` of canonical weights files (section 6.1: "averaging the last 5 checkpoints"):
    -> (the last file's config, {name: mean}).

    Raises:
        ValueError: if ``paths`` is empty, or a file is missing, not canonical, or of another config.
    """
    if not paths:
        raise ValueError("average: no checkpoint given")
    loaded = [weights_io.load_weights(p) for p in paths]
    other = [str(p) for p, (c, _) in zip(paths, loaded, strict=True) if c != loaded[-1][0]]
    if other:
        raise ValueError(f"average_checkpoints: {other} hold another config than {paths[-1]}")
    return loaded[-1][0], average_params([params for _, params in loaded])


def dev_loss(T: ModuleType, model: Any, batches: list, label_smoothing: float) -> float:
    """The label-smoothed loss (``spec.training``) of ``model`` on ``batches`` in evaluation mode, no gradients:
    the mean over every non-pad target of the batches."""
    total, count = 0.0, 0
    for b in batches:
        n = int((b.tgt_out != model.config.pad_id).sum())
        logits = host(model(b.src, b.tgt_in))                                    # (B, T, V) float32
        total += n * training.label_smoothed_cross_entropy(logits, b.tgt_out, model.config, label_smoothing)
        count += n
    return total / count


class Run:
    """One training run of ``T`` in ``out`` on prepared ``data`` (``text.data.Prepared``)."""

    def __init__(self, T: ModuleType, data: Any, out: Path, config: spec.Config, options: Options):
        self.T, self.data, self.out, self.c, self.o = T, data, Path(out), config, options
        self.tokenizer = Tokenizer.load(data.tokenizer_path, config)
        self.batches, self.too_long = self._batches(data.train, options.seed, options.fill_last)
        dev, _ = self._batches(data.dev, 0, fill_last=False)                    # the dev loss: every pair once
        self.dev_batches = [dev.batch(k) for k in range(dev.batches_per_epoch)]
        self.train_config = training.TrainConfig(warmup_steps=options.warmup_steps, lr_scale=options.lr_scale)

    def _batches(self, side: Any, seed: int, fill_last: bool) -> tuple[TokenBatches, int]:
        """The side's pairs tokenised and batched -> (batches, pairs left out for not fitting ``max_len``)."""
        src, tgt = self.tokenizer.encode(side.sources), self.tokenizer.encode(side.targets)
        fits = [i for i in range(len(src)) if max(len(src[i]), len(tgt[i])) < self.c.max_len]
        return TokenBatches([src[i] for i in fits], [tgt[i] for i in fits], self.c, self.o.tokens_per_batch,
                            seed=seed, fill_last=fill_last), len(src) - len(fits)

    def start(self) -> tuple[Any, Any, dict[str, Any]]:
        """-> (model, state, progress): the newest checkpoint of ``out`` if there is one, else step 0.

        Raises:
            ValueError: if the checkpoint was written with other options or another config.
        """
        path = latest_checkpoint(self.out)
        if path is None:
            # from_params of a new model's parameters: the weights of Transformer(config, seed) (spec.init_params
            # in the impls) in a model whose __call__ is evaluation in every backend (a new torch module trains)
            model = self.T.from_params(self.c, self.T.params_of(self.T.Transformer(self.c, seed=self.o.seed)))
            return model, self.T.init_train_state(model, self.train_config, self.o.seed), {
                "step": 0, "train_s": 0.0, "tokens": 0, "positions": 0, "shapes": [], "checkpoints": []}
        progress = json.loads((path / "progress.json").read_text())
        now = dataclasses.asdict(self.o)
        other = [k for k in RESUME_KEYS if progress["options"].get(k) != now[k]]  # a key it lacks: another
        if other or progress["config"] != self.c.to_dict():
            raise ValueError(f"{path}: written with other {', '.join(other) or 'config'} "
                             f"({ {k: progress['options'].get(k) for k in other} or progress['config']}); resume with "
                             "the same ones (the budget and evaluation options may change)")
        model = self.T.load_weights(path / "model.safetensors")
        return model, self.T.load_train_state(path / "train_state.safetensors", model), progress

    def train(self, log: Callable[[dict[str, Any]], None] = print, progress_bar: bool = True) -> dict[str, Any]:
        """Train to the budget, checkpointing and evaluating on the way, then average: -> the final progress."""
        self.out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.tokenizer.path, self.out / "tokenizer.model")          # beside the weights
        model, state, p = self.start()
        next_checkpoint = (int(p["train_s"] // (60 * self.o.checkpoint_minutes)) + 1) * 60 * self.o.checkpoint_minutes
        losses: list[float] = []
        with _progress(progress_bar, self.T.__name__, self._budget_s()) as bar:
            while not self._done(p):
                b, start = self.batches.batch(p["step"]), time.perf_counter()
                loss, model, state = self.T.train_step(model, state, b.src, b.tgt_in, b.tgt_out)
                losses.append(float(host(loss)))                  # the host sync closes the step's timing
                p["train_s"] += time.perf_counter() - start
                p["step"] += 1
                p["tokens"] += b.tokens
                p["positions"] += b.positions
                S, T = b.src.shape[1], b.tgt_in.shape[1]
                shape = [b.positions // (S + T), S, T]              # (rows computed, S, T): an XLA program each
                p["shapes"] += [shape] * (shape not in p["shapes"])
                bar(p, losses[-1])
                if self._checkpoint_due(p, next_checkpoint):
                    log(self.checkpoint(model, state, p, losses))
                    losses, next_checkpoint = [], next_checkpoint + 60 * self.o.checkpoint_minutes
        self.write_average(p)
        return p

    def checkpoint(self, model: Any, state: Any, p: dict[str, Any], losses: list[float]) -> dict[str, Any]:
        """Write ``step-<k>/`` atomically, evaluate it on dev, and append the record to ``log.jsonl``."""
        final, tmp = self.out / f"step-{p['step']:08d}", self.out / f".step-{p['step']:08d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        self.T.save_weights(model, tmp / "model.safetensors")
        self.T.save_train_state(state, tmp / "train_state.safetensors")
        start = time.perf_counter()
        record = {"checkpoint": final.name, "step": p["step"], "train_s": round(p["train_s"], 2), "tokens": p["tokens"],
                  "tokens_per_s": round(p["tokens"] / p["train_s"], 1), "shapes": len(p["shapes"]),
                  "padding": round(1 - p["tokens"] / p["positions"], 4), "train_loss": float(np.mean(losses)),
                  "dev_loss": dev_loss(self.T, model, self.dev_batches, self.train_config.label_smoothing),
                  "dev_bleu_greedy": self.dev_bleu(model).bleu}
        record["eval_s"] = round(time.perf_counter() - start, 2)
        p["checkpoints"] = [*p["checkpoints"], final.name]
        (tmp / "progress.json").write_text(json.dumps({**p, "options": dataclasses.asdict(self.o),
                                                       "config": self.c.to_dict()}, indent=1))
        os.replace(tmp, final)
        with open(self.out / "log.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        return record

    def dev_bleu(self, model: Any, beam_size: int = 1):
        """BLEU of ``model`` on the first ``dev_sentences`` dev pairs (greedy unless ``beam_size`` > 1)."""
        n = self.o.dev_sentences
        hyps = translate(self.T, model, self.tokenizer, self.data.dev.sources[:n], beam_size=beam_size,
                         truncate=True)
        return bleu(hyps, self.data.dev.targets[:n])

    def write_average(self, p: dict[str, Any]) -> Path:
        """``averaged.safetensors``: the mean of the last ``average`` checkpoints of this run, through ``T``'s own
        weights functions (so a backend with its own parameter names averages too)."""
        last = [self.T.params_of(self.T.load_weights(self.out / name / "model.safetensors"))
                for name in p["checkpoints"][-self.o.average:]]
        self.T.save_weights(self.T.from_params(self.c, average_params(last)), self.out / "averaged.safetensors")
        return self.out / "averaged.safetensors"

    def _checkpoint_due(self, p: dict[str, Any], next_checkpoint: float) -> bool:
        if self._done(p):
            return True
        if self.o.checkpoint_steps:
            return p["step"] % self.o.checkpoint_steps == 0
        return p["train_s"] >= next_checkpoint

    def _budget_s(self) -> float | None:
        return None if self.o.minutes is None else 60 * self.o.minutes

    def _done(self, p: dict[str, Any]) -> bool:
        budget = self._budget_s()
        return ((self.o.max_steps is not None and p["step"] >= self.o.max_steps)
                or (budget is not None and p["train_s"] >= budget))


def _progress(enabled: bool, name: str, budget_s: float | None):
    """A context giving ``update(progress, loss)``: a ``rich`` bar over the training-time budget with the loss,
    tokens/s and the ETA, on stderr (stdout keeps the records)."""
    import contextlib

    from rich import console, progress

    bar = progress.Progress(
        progress.TextColumn(name), progress.BarColumn(), progress.TextColumn("step {task.fields[step]}"),
        progress.TextColumn("loss {task.fields[loss]:.3f}"), progress.TextColumn("{task.fields[tps]:,.0f} tok/s"),
        progress.TimeRemainingColumn(), console=console.Console(stderr=True), disable=not enabled)

    @contextlib.contextmanager
    def running():
        with bar:
            task = bar.add_task(name, total=budget_s, step=0, loss=float("nan"), tps=0.0)
            yield lambda p, loss: bar.update(task, completed=p["train_s"], step=p["step"], loss=loss,
                                             tps=p["tokens"] / max(p["train_s"], 1e-9))
    return running()
