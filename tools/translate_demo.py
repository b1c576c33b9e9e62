"""The translation demo (``nox -s translate_demo``): English -> German from the system's gettext catalogs, one
small model trained for the same time in each backend and in the stock ``torch.nn.Transformer`` peer, all from
the same prepared corpus, tokenizer, batches and schedule; test BLEU (beam 4, length penalty 0.6) of each run's
last and averaged checkpoints beside the copy and translation-memory baselines; one checkpoint translated by
every backend (its test BLEU in each, and the greedy output compared where the decisions' margins allow); a
plot of dev BLEU against training minutes.

    python -m tools.translate_demo --minutes 30 --out reports/translate         # the full demo
    python -m tools.translate_demo --minutes 2 --systems jax --parallel 1       # a quick look

Each training runs in its own process, pinned to one core with one intra-op thread (``--parallel 2`` runs two
at once on a 2-core machine, each on its own core), with glibc's malloc keeping freed memory (``text.malloc``, the
``train`` command's default), so the systems are timed alike.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from spec.api import BACKENDS
from spec.data_parallel_cli import HelpFormatter
from text import agreement, catalogs, cli, data
from text.tokenizer import Tokenizer

SYSTEMS = {**{b: b for b in BACKENDS}, "peer": "tools.peer_torch"}   # each system's --backend for text
SAME_CHECKPOINT = "torch"         # whose averaged checkpoint every backend translates


def _text(*args: str, log: Path) -> subprocess.Popen:
    """``python -m text ARGS`` in a child process writing to ``log``."""
    return subprocess.Popen([sys.executable, "-m", "text", *args], stdout=log.open("w"), stderr=subprocess.STDOUT)


def _wait(procs: list[tuple[str, subprocess.Popen, Path]]) -> None:
    for name, proc, log in procs:
        if proc.wait():
            raise SystemExit(f"{name} failed (exit {proc.returncode}); see {log}:\n{log.read_text()[-3000:]}")


def prepare(out: Path, lang: str) -> data.Prepared:
    """The prepared corpus in ``out/data``, made from the catalogs on first use."""
    if not (out / "data" / "corpus.json").is_file():
        data.prepare(catalogs.read_catalogs(lang), out / "data")
    return data.Prepared.load(out / "data")


def train_all(systems: list[str], out: Path, minutes: float, parallel: int, extra: list[str]) -> None:
    """Train every system, ``parallel`` at a time, each pinned to its own core."""
    queue = list(systems)
    while queue:
        batch, queue = queue[:parallel], queue[parallel:]
        procs = []
        for core, name in enumerate(batch):
            run = out / "runs" / name
            run.mkdir(parents=True, exist_ok=True)
            args = ["train", "--backend", SYSTEMS[name], "--data", str(out / "data"), "--out", str(run),
                    "--minutes", str(minutes), "--threads", "1", "--cores", str(core), "--no-progress", *extra]
            procs.append((name, _text(*args, log=run / "train.log"), run / "train.log"))
        _wait(procs)


def evaluate_all(systems: list[str], out: Path, limit: int | None) -> dict[str, dict]:
    """Test BLEU, beam 4, of each run's averaged and last checkpoints, each by its own backend, and of the
    ``SAME_CHECKPOINT`` run's averaged checkpoint by the other backends ("averaged by jax"), two jobs at once."""
    jobs = []
    for name in systems:
        run = out / "runs" / name
        last = run / json.loads((run / "log.jsonl").read_text().splitlines()[-1])["checkpoint"] / "model.safetensors"
        kinds = [("averaged", run / "averaged.safetensors", SYSTEMS[name]), ("last", last, SYSTEMS[name])]
        if name == SAME_CHECKPOINT:
            kinds += [(f"averaged by {b}", run / "averaged.safetensors", b) for b in BACKENDS if b != name]
        for kind, weights, backend in kinds:
            args = ["evaluate", "--backend", backend, "--weights", str(weights), "--tokenizer",
                    str(run / "tokenizer.model"), "--data", str(out / "data"), "--split", "test",
                    "--hypotheses", str(run / f"test-{kind.replace(' ', '-')}.de"),
                    *(["--limit", str(limit)] if limit else [])]
            jobs.append(((name, kind), args, run / f"evaluate-{kind.replace(' ', '-')}.log"))
    results: dict[str, dict] = {}
    for i in range(0, len(jobs), 2):
        procs = [(key, _text(*args, "--cores", str(j % 2), log=log), log)
                 for j, (key, args, log) in enumerate(jobs[i:i + 2])]
        _wait([(str(k), p, log) for k, p, log in procs])
        for (name, kind), _, log in procs:
            results.setdefault(name, {})[kind] = json.loads(log.read_text().strip().splitlines()[-1])
    return results


def same_checkpoint(out: Path, prepared: data.Prepared, n: int) -> dict:
    """The ``SAME_CHECKPOINT`` run's averaged weights translated greedily by every backend on the first ``n`` test
    sentences that get the paper's search limit, against the reference's exact decisions (``text.agreement``,
    ``spec.decisions``): on every decisive sentence all must emit the reference's token ids."""
    from spec import weights_io
    from text.translate import search_ids

    run = out / "runs" / SAME_CHECKPOINT
    config, params = weights_io.load_weights(run / "averaged.safetensors")
    tokenizer = Tokenizer.load(run / "tokenizer.model", config)
    sentences = agreement.fitting(tokenizer, prepared.test.sources, config.max_len)[:n]
    ref, _ = agreement.reference_translations(config, params, tokenizer, sentences)
    ids = {}
    cli.load_backend("torch", threads=1)                                   # the thread settings, before any import
    for name in BACKENDS:
        T = cli.load_backend(name)
        model = T.load_weights(run / "averaged.safetensors")
        ids[name] = search_ids(T, model, tokenizer, sentences, beam_size=1)
    texts = {name: tokenizer.decode(rows) for name, rows in ids.items()}
    identical = sum(texts["torch"][i] == texts["jax"][i] == texts["tf"][i] for i in range(len(sentences)))
    return {"checkpoint": f"{SAME_CHECKPOINT}, averaged", "identical_all_three": identical,
            **agreement.judged(ref, ids)}


def agreement_failures(same: dict) -> list[str]:
    """What the same-checkpoint check found wrong: no decisive sentence (it judged nothing), or a decisive
    sentence a backend decoded otherwise than the reference."""
    if not same["decisive"]:
        return [f"none of {same['sentences']} sentences was decisive: the agreement check judged nothing"]
    return [f"{name}: decisive sentences {rows} differ from the reference's tokens"
            for name, rows in same["decisive_differing"].items() if rows]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m tools.translate_demo", description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument("--out", type=Path, default=Path("reports/translate"), help="runs, reports and the plot")
    p.add_argument("--lang", default="de", help="target language of the catalogs")
    p.add_argument("--minutes", type=float, default=30.0, help="training time per system")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated: backends and the torch peer")
    p.add_argument("--parallel", type=int, default=2, help="trainings at once, each on its own core")
    p.add_argument("--test-limit", type=int, default=None, help="the first N test sentences only")
    p.add_argument("--agreement-sentences", type=int, default=200,
                   help="test sentences one checkpoint translates in every backend")
    p.add_argument("--skip-training", action="store_true", help="evaluate the runs already in --out")
    p.add_argument("--doc", type=Path, help="rewrite this Markdown file's translation section (docs/text.md)")
    a, extra = p.parse_known_args(argv)
    systems, start = a.systems.split(","), time.time()
    prepared = prepare(a.out, a.lang)
    if not a.skip_training:
        train_all(systems, a.out, a.minutes, a.parallel, extra)
    result = {"minutes": a.minutes, "corpus": prepared.stats, "test": evaluate_all(systems, a.out, a.test_limit),
              "runs": {s: [json.loads(x) for x in (a.out / "runs" / s / "log.jsonl").read_text().splitlines()]
                       for s in systems},
              "process": {s: {k: v for k, v in json.loads((a.out / "runs" / s / "run.json").read_text()).items()
                              if k in ("threads", "cores", "malloc")} for s in systems}}
    if SAME_CHECKPOINT in systems:
        result["same_checkpoint"] = same_checkpoint(a.out, prepared, a.agreement_sentences)
        own = result["test"][SAME_CHECKPOINT]
        result["same_checkpoint"]["test_bleu"] = {b: own["averaged" if b == SAME_CHECKPOINT else f"averaged by {b}"]
                                                  ["bleu"] for b in BACKENDS}
    result["wall_s"] = round(time.time() - start)
    (a.out / "translate-demo.json").write_text(json.dumps(result, indent=1, ensure_ascii=False))
    from tools import translate_report
    translate_report.write(result, prepared, a.out, a.doc)
    failures = agreement_failures(result["same_checkpoint"]) if "same_checkpoint" in result else []
    if failures:  # after the report, which records the decisive counts either way
        raise SystemExit("agreement of one checkpoint: " + "; ".join(failures))
    return result


if __name__ == "__main__":
    main()
