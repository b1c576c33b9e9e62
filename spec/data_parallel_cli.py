"""The command line of data-parallel training, the same in every impl: ``python -m impl_<fw>.train_dp``.

The loop, data, split and checkpoints it drives: ``spec.data_parallel`` (its docstring has the whole story).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from spec import data_parallel, demo
from spec.config import PRESETS, Config
from spec.data_parallel import Engine, Options, run


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` keeps the description's layout and gives every option's default (but None and off)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def config_of(name: str, dtype: str, dropout: float | None) -> Config:
    """The model of ``--config``: "demo" (``spec.demo.DEMO_CONFIG``) or a preset; fp32 master weights computing in
    ``dtype``; ``dropout`` (None: the config's own)."""
    base = demo.DEMO_CONFIG if name == "demo" else PRESETS[name]
    c = base.replace(dtype=dtype, param_dtype="float32")
    return c if dropout is None else c.replace(dropout=dropout)


def parser(prog: str) -> argparse.ArgumentParser:
    """The command line of every impl's ``python -m impl_<fw>.train_dp``."""
    p = argparse.ArgumentParser(prog=prog, description=data_parallel.__doc__, formatter_class=HelpFormatter)
    p.add_argument("--data-parallel", type=int, default=1, metavar="N", help="workers (devices or processes)")
    p.add_argument("--steps", type=int, default=300, help="train until this step (a resumed run: until it, too)")
    p.add_argument("--batch", type=int, default=demo.BATCH, help="global batch, split evenly across workers")
    p.add_argument("--seed", type=int, default=demo.SEED, help="weights, data and dropout")
    p.add_argument("--config", default="demo", choices=["demo", *sorted(PRESETS)],
                   help="the model: spec.demo's or a preset")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                   help="compute dtype; the master weights are float32")
    p.add_argument("--dropout", type=float, help="dropout rate (default: the config's)")
    p.add_argument("--warmup-steps", type=int, default=demo.TRAIN_CONFIG.warmup_steps, help="the schedule's warmup")
    p.add_argument("--checkpoint-dir", type=Path, help="write checkpoints here (and --resume from them)")
    p.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints (and at the end)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --checkpoint-dir")
    p.add_argument("--record", type=Path, help="write losses, and weights and gradients at --record-steps, here")
    p.add_argument("--record-steps", type=_ints, default=(1,), help="comma-separated steps to record")
    p.add_argument("--min-accuracy", type=float,
                   help="greedy-decode the held-out set at the end with the average of the last 5 checkpoints' weights "
                        "(every --checkpoint-every steps); exit non-zero below this exact match")
    p.add_argument("--kill-at", type=_kill_at, metavar="STEP:RANK",
                   help="testing aid: worker RANK kills itself (SIGKILL) as step STEP begins, as a crashed host")
    return p


def options(argv: list[str] | None, prog: str) -> Options:
    """Parse and check the command line.

    Raises:
        SystemExit: (argparse's error, status 2) naming the option, if a count is not positive, the batch does not
            split evenly, ``--resume`` or ``--checkpoint-every`` lacks ``--checkpoint-dir``.
    """
    p = parser(prog)
    a = p.parse_args(argv)
    for name in ("data_parallel", "steps", "batch", "checkpoint_every", "warmup_steps"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(a, name)}")
    if a.batch % a.data_parallel:
        p.error(f"--batch {a.batch} must be a multiple of --data-parallel {a.data_parallel}")
    if a.resume and a.checkpoint_dir is None:
        p.error("--resume needs --checkpoint-dir")
    try:
        config = config_of(a.config, a.dtype, a.dropout)
        train_config = dataclasses.replace(demo.TRAIN_CONFIG, warmup_steps=a.warmup_steps)
    except ValueError as e:
        p.error(str(e))
    return Options(a.data_parallel, a.steps, a.batch, a.seed, config, train_config, a.checkpoint_dir,
                   a.checkpoint_every, a.resume, a.record, tuple(a.record_steps), a.min_accuracy, a.kill_at)


def main(T: ModuleType, engine_of: Callable[[Options], Engine], argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m impl_<fw>.train_dp``: parse, build the engine, train, report; with ``--min-accuracy``, decode the
    held-out set of ``spec.demo`` greedily with the average of the last checkpoints' weights
    (``spec.data_parallel.run``; the chief alone).

    Raises:
        SystemExit: on a bad command line (status 2), or non-zero if the exact match is below ``--min-accuracy``.
    """
    framework = T.__name__.removeprefix("impl_")
    o = options(argv, f"python -m {T.__name__}.train_dp")
    if o.record:
        o.record.mkdir(parents=True, exist_ok=True)
    engine = engine_of(o)
    result = run(engine, o, framework)
    if not engine.chief:
        return result
    done = len(result["losses"])
    line = (f"{T.__name__}: {o.data_parallel} worker(s), steps {result['first_step']}-{o.steps} of {o.batch}, "
            f"{result['train_s']:.1f} s of training" + (f", final loss {result['losses'][-1]:.3f}" if done else ""))
    if o.min_accuracy is not None:
        model = T.from_params(o.config, result.get("averaged") or engine.params())  # no step taken: the weights
        result["accuracy"] = demo.evaluate(T, model, o.config, demo.heldout(o.config))
        line += f", held-out exact match {result['accuracy']:.1%}"
    print(line, flush=True)
    if o.min_accuracy is not None and result["accuracy"] < o.min_accuracy:
        raise SystemExit(f"{T.__name__}: exact match {result['accuracy']:.3f} is below --min-accuracy "
                         f"{o.min_accuracy}")
    return result


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def _kill_at(text: str) -> tuple[int, int]:
    step, _, rank = text.partition(":")
    return int(step), int(rank or 0)
