"""The command line: ``python -m text <command>``, driving any backend through the common API.

    python -m text prepare --catalogs de --out data/en-de            # or --source F --target F, or --tsv F
    python -m text train --backend jax --data data/en-de --out runs/jax --minutes 30
    python -m text translate --backend tf --weights runs/jax/averaged.safetensors < sentences.en
    python -m text translate --backend jax --marian opus-mt-en-de < sentences.en   # a transformers checkpoint
    python -m text evaluate --backend torch --weights runs/jax/averaged.safetensors --data data/en-de
    python -m text average --out avg.safetensors runs/jax/step-*/model.safetensors
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import spec
import spec.api
import spec.convert.marian
from spec.data_parallel_cli import HelpFormatter
from text import catalogs, corpus, data, evaluate, malloc, train
from text.marian import MarianTokenizer
from text.tokenizer import Tokenizer
from text.translate import translate

BACKENDS = {b: f"impl_{b}" for b in spec.api.BACKENDS}


def load_backend(name: str, threads: int | None = None, cores: list[int] | None = None) -> ModuleType:
    """The impl module for ``name`` (torch, jax, tf, or a module path), imported after the thread settings.

    ``cores`` pins the process to those CPU cores (``os.sched_setaffinity``); ``threads`` sets every framework's
    intra-op thread count through the variables each reads at start (OpenMP for torch, TensorFlow's, XLA's flag
    for JAX), which is why the import comes after them.
    """
    if cores:
        os.sched_setaffinity(0, cores)
    if threads:
        os.environ["OMP_NUM_THREADS"] = os.environ["TF_NUM_INTRAOP_THREADS"] = str(threads)
        os.environ["TF_NUM_INTEROP_THREADS"] = "1"
        flags = f"--xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'} " \
                f"intra_op_parallelism_threads={threads}"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return _import_quietly(BACKENDS.get(name, name))


def _import_quietly(module: str) -> ModuleType:
    """``import module`` with what native libraries write to the process's stderr while they load (TensorFlow's
    start-up log, written before any logging setting applies) held back; shown if the import fails."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            return importlib.import_module(module)
        except BaseException:
            os.dup2(saved, 2)
            held.seek(0)
            sys.stderr.write(held.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _read(a: argparse.Namespace) -> corpus.Read:
    if a.catalogs:
        return catalogs.read_catalogs(a.catalogs, a.locale_dir)
    if a.tsv:
        return corpus.read_tsv(a.tsv)
    if a.source and a.target:
        return corpus.read_parallel(a.source, a.target)
    raise SystemExit("prepare: give --catalogs LANG, --tsv FILE, or --source FILE and --target FILE")


def cmd_prepare(a: argparse.Namespace) -> None:
    prepared = data.prepare(_read(a), a.out, a.vocab_size, rules=tuple(a.rules.split(",")), max_words=a.max_words,
                            dev=a.dev, test=a.test)
    print(json.dumps(prepared.stats, indent=1, ensure_ascii=False))


def cmd_train(a: argparse.Namespace) -> None:
    kept = malloc.retain_freed_memory() if a.malloc == "retain" else {}  # before the frameworks' threads start
    T = load_backend(a.backend, a.threads, a.cores)
    options = train.Options(a.minutes, a.steps, a.tokens_per_batch, a.warmup_steps, a.lr_scale,
                            a.checkpoint_minutes, a.checkpoint_steps, a.average, a.dev_sentences, a.seed)
    config = spec.preset(a.preset)
    run = train.Run(T, data.Prepared.load(a.data), a.out, config, options)
    (Path(a.out) / "run.json").parent.mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "run.json").write_text(json.dumps({"backend": T.__name__, "threads": a.threads, "cores": a.cores,
                                                      "malloc": kept,
                                                      "options": dataclasses.asdict(options),
                                                      "config": config.to_dict()}, indent=1))
    result = run.train(log=lambda r: print(json.dumps(r), flush=True), progress_bar=not a.no_progress)
    print(f"{T.__name__}: {result['step']} steps, {result['tokens']:,} tokens in {result['train_s']:.0f} s of "
          f"training ({result['tokens'] / result['train_s']:,.0f} tokens/s); averaged the last "
          f"{min(a.average, len(result['checkpoints']))} checkpoints into {Path(a.out) / 'averaged.safetensors'}")


def _model(a: argparse.Namespace):
    """(impl module, model, tokenizer); the weights' config and the tokenizer are checked before the framework
    is imported."""
    if getattr(a, "marian", None):  # a transformers checkpoint folder: weights and tokenizer converted
        config, params = spec.convert.marian.load(a.marian)
        tokenizer = MarianTokenizer.load(a.marian, config)
        T = load_backend(a.backend, a.threads, a.cores)
        return T, T.from_params(config, params), tokenizer
    tokenizer = Tokenizer.load(a.tokenizer or Path(a.weights).parent / "tokenizer.model",
                               spec.weights_io.read_config(a.weights))
    T = load_backend(a.backend, a.threads, a.cores)
    return T, T.load_weights(a.weights), tokenizer


def cmd_translate(a: argparse.Namespace) -> None:
    T, model, tokenizer = _model(a)
    lines = corpus.read_lines(a.input) if a.input else corpus.read_lines("<stdin>", sys.stdin.buffer.read())
    sentences = [corpus.normalize_whitespace(line) for line in lines]
    for line in translate(T, model, tokenizer, sentences, beam_size=a.beam):
        print(line)


def cmd_evaluate(a: argparse.Namespace) -> None:
    T, model, tokenizer = _model(a)
    side = getattr(data.Prepared.load(a.data), a.split)
    n = a.limit or len(side)
    hyps = translate(T, model, tokenizer, side.sources[:n], beam_size=a.beam, truncate=True)
    score = evaluate.bleu(hyps, side.targets[:n])
    cut = sum(len(ids) >= model.config.max_len for ids in tokenizer.encode(side.sources[:n]))
    print(json.dumps({"backend": T.__name__, "weights": str(a.weights), "split": a.split, "sentences": n,
                      "sources_truncated": cut, "beam": a.beam, "bleu": score.bleu,
                      "length_ratio": score.length_ratio, "signature": score.signature}))
    if a.hypotheses:
        Path(a.hypotheses).write_text("".join(h + "\n" for h in hyps))


def cmd_average(a: argparse.Namespace) -> None:
    config, params = train.average_checkpoints(a.weights)
    spec.weights_io.save_weights(a.out, config, params)
    print(f"averaged {len(a.weights)} checkpoints into {a.out}")


TRAIN_HELP = {"tokens_per_batch": "positions per side, B * max(S, T), per step (section 5.1)",
              "warmup_steps": "the schedule's warmup (section 5.3)",
              "checkpoint_minutes": "minutes of training between checkpoints",
              "lr_scale": "peak learning rate lr_scale * d_model^-0.5 * warmup_steps^-0.5",
              "average": "checkpoints averaged at the end (section 6.1)",
              "dev_sentences": "dev sentences decoded at each checkpoint for BLEU",
              "seed": "weights, batches and dropout"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m text", description=__doc__, formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    d = HelpFormatter
    pre = sub.add_parser("prepare", help="read, clean and split a corpus; train the tokenizer", formatter_class=d)
    pre.add_argument("--catalogs", metavar="LANG", help="English -> LANG from the system's gettext catalogs")
    pre.add_argument("--locale-dir", default=str(catalogs.LOCALE_DIR), help="where the catalogs are")
    pre.add_argument("--tsv", help="one pair per line: source<TAB>target")
    pre.add_argument("--source", help="one source sentence per line (with --target)")
    pre.add_argument("--target", help="one target sentence per line, aligned with --source")
    pre.add_argument("--out", required=True, help="the prepared corpus: splits, tokenizer, corpus.json")
    pre.add_argument("--vocab-size", type=int, default=8000, help="the shared SentencePiece vocabulary")
    pre.add_argument("--rules", default=",".join(corpus.DEFAULT_RULES), help="cleaning rules, in order")
    pre.add_argument("--max-words", type=int, default=corpus.MAX_WORDS, help="the too_long rule's limit")
    pre.add_argument("--dev", type=float, default=0.02, help="fraction of near-duplicate groups")
    pre.add_argument("--test", type=float, default=0.03, help="fraction of near-duplicate groups")
    pre.set_defaults(run=cmd_prepare)

    defaults = train.Options()
    tr = sub.add_parser("train", help="train a model on a prepared corpus", formatter_class=d)
    _backend_args(tr)
    tr.add_argument("--data", required=True, help="a corpus from `prepare`")
    tr.add_argument("--out", required=True, help="run folder: checkpoints, log.jsonl, averaged.safetensors")
    tr.add_argument("--preset", default="mini", choices=sorted(spec.config.PRESETS), help="the model's size")
    tr.add_argument("--minutes", type=float, default=defaults.minutes, help="training time, evaluation excluded")
    tr.add_argument("--steps", type=int, default=None, help="stop after this many steps instead")
    for name in ("tokens_per_batch", "warmup_steps", "checkpoint_minutes", "lr_scale", "average",
                 "dev_sentences", "seed"):
        value = getattr(defaults, name)
        tr.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value, help=TRAIN_HELP[name])
    tr.add_argument("--checkpoint-steps", type=int, default=None, help="checkpoint every N steps instead")
    tr.add_argument("--malloc", default="retain", choices=("retain", "default"),
                    help="glibc's malloc keeps freed memory for the next step (text.malloc), or its defaults")
    tr.add_argument("--no-progress", action="store_true", help="no progress bar")
    tr.set_defaults(run=cmd_train)

    for name, fn, helptext in (("translate", cmd_translate, "translate stdin or --input, one sentence a line"),
                               ("evaluate", cmd_evaluate, "BLEU on a split of a prepared corpus")):
        s = sub.add_parser(name, help=helptext, formatter_class=d)
        _backend_args(s)
        source = s.add_mutually_exclusive_group(required=True)
        source.add_argument("--weights", help="a canonical weights file (any backend's)")
        if name == "translate":
            source.add_argument("--marian", help="a transformers MarianMTModel folder (config.json, "
                                "model.safetensors, source.spm, target.spm, vocab.json), converted on load")
        s.add_argument("--tokenizer", help="default: tokenizer.model beside the weights")
        s.add_argument("--beam", type=int, default=4, help="beam size; 1 is greedy search")
        if name == "translate":
            s.add_argument("--input", help="default: stdin")
        else:
            s.add_argument("--data", required=True, help="a corpus from `prepare`")
            s.add_argument("--split", default="test", choices=data.SPLITS, help="the split scored")
            s.add_argument("--limit", type=int, default=None, help="the first N sentences only")
            s.add_argument("--hypotheses", help="write the translations here")
        s.set_defaults(run=fn)

    av = sub.add_parser("average", help="average canonical weights files (section 6.1)", formatter_class=d)
    av.add_argument("--out", required=True, help="the averaged weights file")
    av.add_argument("weights", nargs="+", help="canonical weights files of one config")
    av.set_defaults(run=cmd_average)
    return p


def _backend_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="torch", help="torch, jax, tf, or an impl module's import path")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of the framework")
    p.add_argument("--cores", type=lambda s: [int(x) for x in s.split(",")], default=None,
                   help="pin the process to these CPU cores, e.g. 0 or 0,1")


def main(argv: list[str] | None = None) -> None:
    a = parser().parse_args(argv)
    try:
        a.run(a)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
