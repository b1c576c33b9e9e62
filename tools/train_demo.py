"""The training demo: one impl trains on the reverse task (``spec.demo``) and decodes its held-out set.

Training runs through the common API alone (``spec.api``): ``Transformer(config, seed)``, ``init_train_state``,
``train_step``, ``params_of``, ``from_params``, ``greedy_search``; the impl module is chosen by ``--backend``.
Every backend starts from the same weights and sees the same batches (``spec.demo``); only the dropout masks (each
framework's own RNG) and the rounding of each backend's arithmetic differ. Greedy decoding of the fixed held-out set
by the average of the last 5 checkpoints (section 6.1) gives the exact-match accuracy.

    python -m tools.train_demo --backend torch [--steps N] [--batch B] [--seed S] [--out run.json]
                               [--save weights.safetensors] [--min-accuracy 0.99]
"""

from __future__ import annotations

import argparse
import collections
import collections.abc
import dataclasses
import json
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from rich import console, progress

from spec.api import BACKENDS
from spec.config import Config
from spec.data_parallel_cli import HelpFormatter
from spec.demo import (
    AVERAGE,
    BATCH,
    DEMO_CONFIG,
    HELDOUT_SIZE,
    SEED,
    STEPS,
    TRAIN_CONFIG,
    evaluate,
    heldout,
    reverse_batch,
)
from spec.training import TrainConfig, average_params
from text import cli

EVAL_EVERY = 100  # steps between held-out evaluations, to record when the accuracy crosses TARGET
TARGET = 0.99


def run(T: ModuleType, steps: int = STEPS, batch: int = BATCH, seed: int = SEED, progress: bool = True, *,
        config: Config = DEMO_CONFIG, train_config: TrainConfig = TRAIN_CONFIG, eval_every: int = EVAL_EVERY,
        evaluate_checkpoints: bool = True, save: Path | None = None) -> dict[str, Any]:
    """Train ``T.Transformer(config, seed)`` for ``steps`` steps of ``batch`` sequences, then decode the held-out
    set greedily with the average of the last ``AVERAGE`` checkpoints. ``seed`` seeds the weights, the data and the
    dropout RNG.

    A checkpoint is taken every ``eval_every`` steps and at the end (0: at the end only); at each, the held-out
    accuracy of the averaged model and of the model as it is are recorded, timed apart from ``train_s`` (with
    ``evaluate_checkpoints=False``, at the last only: the same final accuracy for less time). With ``save``, the
    final averaged model's weights are written there (``T.save_weights``, the canonical format). Returns
    {"losses": [float per step], "evals": [[step, accuracy averaged, accuracy as is, train_s]], "accuracy": the
    final averaged model's, "steps", "batch", "seed", "train_s" (training alone), "wall_s" (everything, model
    building and evaluations included), "target_step"/"target_s": the first evaluation whose averaged model
    reaches ``TARGET`` and the training seconds to it (None if none)}.
    """
    start = time.perf_counter()
    model = T.Transformer(config, seed=seed)
    state = T.init_train_state(model, train_config, seed=seed)
    rng, data = np.random.default_rng(seed), heldout(config)
    losses, evals, checkpoints, train_s = [], [], collections.deque(maxlen=AVERAGE), 0.0
    with _progress(progress) as bar:
        task = bar.add_task(T.__name__, total=steps, loss=float("nan"), acc=float("nan"))
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            loss, model, state = T.train_step(model, state, *reverse_batch(rng, config, batch))
            losses.append(float(loss))  # one host sync per step: the record needs it, and on CPU it costs nothing
            train_s += time.perf_counter() - t0
            if step == steps or eval_every and step % eval_every == 0:
                checkpoints.append({k: np.array(a) for k, a in T.params_of(model).items()})  # copies: torch's are views
                if evaluate_checkpoints or step == steps:
                    evals.append([step, evaluate(T, T.from_params(config, average_params(checkpoints)), config, data),
                                  evaluate(T, model, config, data), round(train_s, 3)])
                    bar.update(task, acc=evals[-1][1])
            bar.update(task, advance=1, loss=losses[-1])
    if save is not None:
        T.save_weights(T.from_params(config, average_params(checkpoints)), save)
    hit = next((e for e in evals if e[1] >= TARGET), None)
    return {"backend": T.__name__, "losses": losses, "evals": evals, "accuracy": evals[-1][1], "steps": steps,
            "batch": batch, "seed": seed, "train_s": round(train_s, 3),
            "wall_s": round(time.perf_counter() - start, 3), "target": TARGET,
            "target_step": hit and hit[0], "target_s": hit and hit[-1], "average": AVERAGE,
            "config": config.to_dict(), "train_config": dataclasses.asdict(train_config),
            "version": getattr(T, "__version__", None)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The command line: train ``impl_<--backend>``, print the accuracy, write ``--out``.

    Raises:
        SystemExit: non-zero if the accuracy is below ``--min-accuracy``.
    """
    p = argparse.ArgumentParser(prog="python -m tools.train_demo", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--backend", choices=BACKENDS, required=True, help="the impl that trains: impl_<backend>")
    p.add_argument("--steps", type=int, default=STEPS, help="training steps")
    p.add_argument("--batch", type=int, default=BATCH, help="sequences per step")
    p.add_argument("--seed", type=int, default=SEED, help="weights, data and dropout")
    p.add_argument("--eval-every", type=int, default=EVAL_EVERY,
                   help="a checkpoint and held-out evaluations every N steps; 0: at the end only")
    p.add_argument("--out", type=Path, help="write the run (losses per step, accuracy, times) as JSON here")
    p.add_argument("--save", type=Path, help="write the final averaged model's weights (safetensors) here")
    p.add_argument("--min-accuracy", type=float, help="exit non-zero if the final exact match is below this")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--threads", type=int, help="the framework's intra-op threads (default: the framework's own)")
    args = p.parse_args(argv)
    T = cli.load_backend(args.backend, args.threads)
    result = run(T, args.steps, args.batch, args.seed, progress=not args.no_progress, eval_every=args.eval_every,
                 save=args.save)
    result["threads"] = args.threads
    print(summary(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    if args.min_accuracy is not None and result["accuracy"] < args.min_accuracy:
        raise SystemExit(f"{T.__name__}: exact match {result['accuracy']:.3f} is below --min-accuracy "
                         f"{args.min_accuracy}")
    return result


def summary(result: dict[str, Any]) -> str:
    """One line per run: final loss, held-out exact match, times, and when it first reached ``TARGET``."""
    reached = (f"reached {result['target']:.0%} at step {result['target_step']} ({result['target_s']:.0f} s of "
               f"training)" if result["target_step"] else f"never reached {result['target']:.0%}")
    return (f"{result['backend']}: {result['steps']} steps of {result['batch']}, final loss "
            f"{result['losses'][-1]:.3f}, held-out exact match {result['accuracy']:.1%} ({HELDOUT_SIZE} "
            f"sequences), training {result['train_s']:.0f} s, wall {result['wall_s']:.0f} s; {reached}")



# ----------------------------------------------------------------- internals

def _progress(enabled: bool):
    """A ``rich`` progress bar on stderr with the last loss and held-out accuracy (stdout keeps the results)."""
    return progress.Progress(
        progress.TextColumn("{task.description}"), progress.BarColumn(), progress.MofNCompleteColumn(),
        progress.TimeElapsedColumn(), progress.TimeRemainingColumn(),
        progress.TextColumn("loss {task.fields[loss]:.3f}  held-out exact match {task.fields[acc]:.1%}"),
        console=console.Console(stderr=True), disable=not enabled)


if __name__ == "__main__":
    main()
