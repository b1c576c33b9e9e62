"""The language-model demo: one impl's decoder-only model learns English from CPython's own documentation.

The corpus is ``pydoc_data.topics`` (the text of ``help()`` topics, shipped with CPython), read at run time. The
held-out topics are the last ones by sorted key that make up at least ``HELDOUT_SHARE`` of the characters; a
byte-level BPE (``text.bpe``) is trained on the others. Each topic becomes BOS, its ids, EOS, and the topics are
joined into one stream per split. Training goes through the common API alone (``LanguageModel``,
``init_train_state``, ``lm_train_step``, ``lm_loss_and_gradients``, ``generate``): every backend starts from the
same weights and draws the same windows in the same order from NumPy, and dropout is 0, so only each framework's
rounding tells the runs apart. The validation loss is the mean next-token cross entropy over fixed held-out windows;
the baseline beside it is a unigram model of the training stream (add-one smoothed) on the same targets.

    python -m tools.lm_demo --backend torch [--steps N] [--batch B] [--seed S] [--dtype float32] [--out run.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import time
from pathlib import Path
from pydoc_data.topics import topics
from types import ModuleType
from typing import Any

import numpy as np
from rich import console, progress

from bench.common import machine
from spec.api import BACKENDS
from spec.config import Config
from spec.data_parallel_cli import HelpFormatter
from spec.training import TrainConfig
from text import cli
from text.bpe import ByteLevelBPE

HELDOUT_SHARE = 0.10
VOCAB = 2048
CONFIG = Config(vocab_size=VOCAB, d_model=192, n_heads=4, d_k=48, d_v=48, d_ff=768, n_encoder_layers=0,
                n_decoder_layers=3, max_len=128, dropout=0.0, norm_first=True, param_dtype="float32")
# A short warmup to a peak of about 2e-3 (lr_scale * d_model^-0.5 * warmup^-0.5), then the paper's 1/sqrt(t) decay.
TRAIN_CONFIG = TrainConfig(label_smoothing=0.0, warmup_steps=50, lr_scale=0.2)
STEPS, BATCH, SEED, EVAL_EVERY = 400, 16, 0, 50
VAL_BATCH = 16
# The opening of a held-out topic ("with"): the model has never seen what follows it.
PROMPT = 'The "with" statement is used to'
NEW_TOKENS = 48
SAMPLING = {"greedy": {"temperature": 0.0}, "sampled": {"temperature": 0.8, "top_p": 0.95}}


@dataclasses.dataclass(frozen=True)
class Corpus:
    """The two token streams, the tokenizer and what a report says about them."""

    bpe: ByteLevelBPE
    train: np.ndarray
    heldout: np.ndarray
    heldout_topics: list[str]

    def stats(self) -> dict[str, Any]:
        return {"source": "pydoc_data.topics", "train_tokens": int(self.train.size),
                "heldout_tokens": int(self.heldout.size), "heldout_topics": self.heldout_topics,
                "vocab_size": self.bpe.vocab_size,
                "tokenizer_sha256": hashlib.sha256(self.bpe.to_str().encode()).hexdigest()}


def split_topics(texts: dict[str, str] = topics, share: float = HELDOUT_SHARE) -> tuple[list[str], list[str]]:
    """(training keys, held-out keys): the held-out ones are the shortest run at the end of the sorted keys holding
    at least ``share`` of the characters, so that whole topics, not pieces of one, are unseen."""
    keys, total, held = sorted(texts), sum(map(len, texts.values())), 0
    cut = len(keys)
    while held < share * total:
        cut -= 1
        held += len(texts[keys[cut]])
    return keys[:cut], keys[cut:]


def corpus(config: Config = CONFIG, texts: dict[str, str] = topics) -> Corpus:
    """The tokenizer trained on the training topics and both splits as streams of BOS, ids, EOS per topic."""
    train_keys, held_keys = split_topics(texts)
    bpe = ByteLevelBPE.train((texts[k] for k in train_keys), config.vocab_size, config)

    def stream(keys: list[str]) -> np.ndarray:
        return np.concatenate([[config.bos_id, *bpe.encode(texts[k]), config.eos_id] for k in keys]).astype(np.int64)

    return Corpus(bpe, stream(train_keys), stream(held_keys), held_keys)


def batches(stream: np.ndarray, length: int, batch: int, seed: int):
    """Endless (batch, length) windows at uniform random starts, drawn from NumPy's generator at ``seed``: the
    same windows in the same order for every backend."""
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, stream.size - length + 1, batch)
        yield stream[starts[:, None] + np.arange(length)]


def heldout_windows(stream: np.ndarray, length: int, batch: int = VAL_BATCH) -> np.ndarray:
    """Windows overlapping by one token, so every held-out token after the first is a target once, cut to whole
    batches (one shape: no recompilation in JAX)."""
    n = (stream.size - 1) // (length - 1) // batch * batch
    return stream[np.arange(n)[:, None] * (length - 1) + np.arange(length)]


def unigram(train: np.ndarray, windows: np.ndarray, vocab: int) -> dict[str, float]:
    """The training stream's unigram entropy and the add-one smoothed unigram's cross entropy on the held-out
    targets (nats): the loss of a model that ignores the context."""
    counts = np.bincount(train, minlength=vocab) + 1.0
    p = counts / counts.sum()
    return {"entropy": float(-(p * np.log(p)).sum()), "cross_entropy": float(-np.log(p[windows[:, 1:]]).mean())}


def validation_loss(T: ModuleType, model: Any, windows: np.ndarray) -> float:
    """Mean next-token cross entropy over the windows (every batch full, so the mean of batch means)."""
    losses = [float(T.lm_loss_and_gradients(model, w)[0]) for w in np.split(windows, len(windows) // VAL_BATCH)]
    return float(np.mean(losses))


def run(T: ModuleType, steps: int = STEPS, batch: int = BATCH, seed: int = SEED, *, config: Config = CONFIG,
        train_config: TrainConfig = TRAIN_CONFIG, eval_every: int = EVAL_EVERY, new_tokens: int = NEW_TOKENS,
        val_windows: int | None = None, threads: int | None = None, show_progress: bool = True) -> dict[str, Any]:
    """Train ``T.LanguageModel(config, seed)`` for ``steps`` steps of ``batch`` windows of ``config.max_len``
    tokens, evaluating at step 0, every ``eval_every`` steps and at the end (on the first ``val_windows`` held-out
    windows, a multiple of ``VAL_BATCH``; None: all); then generate from ``PROMPT``.

    Returns {"losses": [training loss per step], "evals": [[step, validation loss, perplexity, train_s]],
    "samples": {name: {"ids", "text", "tokens"}}, "unigram", "corpus", "train_s" (training steps alone),
    "eval_s", "wall_s", "cpu_s" (the process's CPU time: on a shared machine, what the run itself cost),
    "load_average" (the 1-minute load at the start and the end), the settings, ``threads`` as given (recorded
    only) and the machine}.
    """
    start, cpu_start, load_start = time.perf_counter(), time.process_time(), os.getloadavg()[0]
    data = corpus(config)
    windows = heldout_windows(data.heldout, config.max_len)[:val_windows]
    model = T.LanguageModel(config, seed=seed)
    state = T.init_train_state(model, train_config, seed=seed)
    losses, evals, train_s, eval_s = [], [], 0.0, 0.0
    with _progress(show_progress) as bar:
        task = bar.add_task(T.__name__, total=steps, loss=math.nan, val=math.nan)
        draws = batches(data.train, config.max_len, batch, seed)
        for step in range(steps + 1):
            if step % eval_every == 0 or step == steps:
                t0 = time.perf_counter()
                val = validation_loss(T, model, windows)
                eval_s += time.perf_counter() - t0
                evals.append([step, val, math.exp(val), round(train_s, 3)])
                bar.update(task, val=val)
            if step == steps:
                break
            t0 = time.perf_counter()
            loss, model, state = T.lm_train_step(model, state, next(draws))
            losses.append(float(loss))  # the host sync the record needs; on CPU it costs nothing
            train_s += time.perf_counter() - t0
            bar.update(task, advance=1, loss=losses[-1])
    return {"backend": T.__name__, "losses": losses, "evals": evals, "samples": samples(T, model, data.bpe, new_tokens,
            seed), "prompt": PROMPT, "unigram": unigram(data.train, windows, config.vocab_size),
            "corpus": {**data.stats(), "heldout_windows": len(windows), "heldout_targets": int(windows[:, 1:].size)},
            "steps": steps, "batch": batch, "seed": seed, "train_s": round(train_s, 3), "eval_s": round(eval_s, 3),
            "wall_s": round(time.perf_counter() - start, 3), "cpu_s": round(time.process_time() - cpu_start, 3),
            "load_average": [load_start, os.getloadavg()[0]], "config": config.to_dict(),
            "train_config": dataclasses.asdict(train_config), "version": getattr(T, "__version__", None),
            "threads": threads, "machine": machine()}


def samples(T: ModuleType, model: Any, bpe: ByteLevelBPE, new_tokens: int, seed: int) -> dict[str, Any]:
    """``generate`` from BOS + ``PROMPT`` greedily and sampled (``SAMPLING``) with ``seed``: ids, text, and each
    token's text (for the report's first divergence)."""
    prompt = np.array([[model.config.bos_id, *bpe.encode(PROMPT)]], dtype=np.int64)
    out = {}
    for name, options in SAMPLING.items():
        ids = [int(i) for i in np.asarray(T.generate(model, prompt, new_tokens, seed=seed, **options))[0]]
        out[name] = {**options, "ids": ids, "text": bpe.decode(ids), "tokens": bpe.tokens(ids)}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The command line: train ``impl_<--backend>``, print a summary, write ``--out``."""
    p = argparse.ArgumentParser(prog="python -m tools.lm_demo", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--backend", choices=BACKENDS, required=True, help="the impl that trains: impl_<backend>")
    p.add_argument("--steps", type=int, default=STEPS, help="training steps")
    p.add_argument("--batch", type=int, default=BATCH, help="windows per step")
    p.add_argument("--seed", type=int, default=SEED, help="weights, windows and sampling")
    p.add_argument("--eval-every", type=int, default=EVAL_EVERY, help="steps between validation losses")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default=CONFIG.dtype,
                   help="the compute dtype (the master weights stay float32)")
    p.add_argument("--threads", type=int, default=1, help="the framework's intra-op threads")
    p.add_argument("--out", type=Path, help="write the run as JSON here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    T = cli.load_backend(args.backend, args.threads)
    result = run(T, args.steps, args.batch, args.seed, config=CONFIG.replace(dtype=args.dtype),
                 eval_every=args.eval_every, threads=args.threads, show_progress=not args.no_progress)
    print(summary(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False))
    return result


def summary(result: dict[str, Any]) -> str:
    """One line per run: the final validation loss beside the unigram baseline, the times, the greedy sample."""
    step, val, ppl, _ = result["evals"][-1]
    return (f"{result['backend']} ({result['config']['dtype']}): {result['steps']} steps of {result['batch']}, "
            f"validation loss {val:.3f} (perplexity {ppl:.1f}) at step {step}; unigram "
            f"{result['unigram']['cross_entropy']:.3f}; training {result['train_s']:.0f} s, wall "
            f"{result['wall_s']:.0f} s\n  {result['prompt']}{result['samples']['greedy']['text']!r}")


# ----------------------------------------------------------------- internals

def _progress(enabled: bool):
    """A ``rich`` progress bar on stderr with the last training and validation losses (stdout keeps the results)."""
    return progress.Progress(
        progress.TextColumn("{task.description}"), progress.BarColumn(), progress.MofNCompleteColumn(),
        progress.TimeElapsedColumn(), progress.TimeRemainingColumn(),
        progress.TextColumn("loss {task.fields[loss]:.3f}  validation {task.fields[val]:.3f}"),
        console=console.Console(stderr=True), disable=not enabled)


if __name__ == "__main__":
    main()
