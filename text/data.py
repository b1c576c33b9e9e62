"""A prepared corpus on disk: the cleaned train/dev/test split as TSV files, the shared tokenizer trained on the
train split, and ``corpus.json`` with what each step kept and removed.

    prepare(read, out, vocab_size=8000) -> Prepared     # writes out/{train,dev,test}.tsv, tokenizer.model, corpus.json
    Prepared.load(out)                                  # reads them back
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from text import corpus, evaluate
from text.tokenizer import Tokenizer

SPLITS = ("train", "dev", "test")


@dataclasses.dataclass(frozen=True)
class Side:
    """One split: parallel lists of source and target sentences."""

    sources: list[str]
    targets: list[str]

    def __len__(self) -> int:
        return len(self.sources)


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A prepared corpus folder."""

    root: Path
    train: Side
    dev: Side
    test: Side
    stats: dict[str, Any]

    @property
    def tokenizer_path(self) -> Path:
        return self.root / "tokenizer.model"

    @classmethod
    def load(cls, root: str | os.PathLike) -> Prepared:
        """Read a folder written by ``prepare``.

        Raises:
            ValueError: naming the folder and the file missing.
        """
        root = Path(root)
        missing = [n for n in (*(f"{s}.tsv" for s in SPLITS), "tokenizer.model", "corpus.json")
                   if not (root / n).is_file()]
        if missing:
            raise ValueError(f"{root}: not a prepared corpus (missing {', '.join(missing)}); run "
                             "`python -m text prepare` first")
        sides = {s: _side(corpus.read_tsv(root / f"{s}.tsv").pairs) for s in SPLITS}
        return cls(root, **sides, stats=json.loads((root / "corpus.json").read_text()))


def prepare(read: corpus.Read, out: str | os.PathLike, vocab_size: int = 8000, *,
            rules: tuple[str, ...] = corpus.DEFAULT_RULES, max_words: int = corpus.MAX_WORDS,
            dev: float = 0.02, test: float = 0.03, baselines: bool = True) -> Prepared:
    """Clean, split, train the tokenizer on the train split (both sides), write everything to ``out``.

    With ``baselines``, ``corpus.json`` also holds the near-duplicate rate of dev and test against train and the
    BLEU of the copy and translation-memory baselines (``text.evaluate``).

    Raises:
        ValueError: if cleaning leaves no pair, or a split is empty.
    """
    out = Path(out)
    pairs, counts = corpus.clean(read.pairs, rules, max_words)
    if not pairs:
        raise ValueError(f"prepare: no pair left after cleaning ({counts})")
    parts = corpus.split(pairs, dev, test)
    sizes = {s: len(getattr(parts, s)) for s in SPLITS}
    if not all(sizes.values()):
        raise ValueError(f"prepare: a split is empty ({sizes}); give a larger corpus or larger dev/test fractions")
    out.mkdir(parents=True, exist_ok=True)
    for s in SPLITS:
        (out / f"{s}.tsv").write_text("".join(f"{p.source}\t{p.target}\n" for p in getattr(parts, s)))
    train = _side(parts.train)
    Tokenizer.train(train.sources + train.targets, out / "tokenizer.model", vocab_size)
    stats: dict[str, Any] = {"read": len(read.pairs), "skipped": dict(read.skipped), "cleaning": counts,
                             "rules": list(rules), "max_words": max_words, "split": sizes,
                             "fractions": {"dev": dev, "test": test}, "vocab_size": vocab_size}
    if baselines:
        stats["baselines"] = {s: _baselines(train, _side(getattr(parts, s))) for s in ("dev", "test")}
    (out / "corpus.json").write_text(json.dumps(stats, indent=1, ensure_ascii=False))
    return Prepared.load(out)


def _side(pairs: list[corpus.Pair]) -> Side:
    return Side([p.source for p in pairs], [p.target for p in pairs])


def _baselines(train: Side, held: Side) -> dict[str, Any]:
    copy = evaluate.bleu(evaluate.copy_source(held.sources), held.targets)
    memory = evaluate.bleu(evaluate.translation_memory(train.sources, train.targets, held.sources), held.targets)
    return {"near_duplicate_rate_90": evaluate.near_duplicate_rate(train.sources, held.sources),
            "copy_bleu": copy.bleu, "copy_length_ratio": copy.length_ratio, "memory_bleu": memory.bleu,
            "memory_length_ratio": memory.length_ratio, "signature": copy.signature}
