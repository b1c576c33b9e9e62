"""BLEU as sacreBLEU computes it, and the two baselines a translation model must beat on the same split.

- ``copy_source``: the source sentence returned unchanged (catalogs are full of names, options and format strings
  that a translation keeps, so copying scores far above zero);
- ``translation_memory``: for each source, the target side of the most similar training source (character-level
  similarity, ``rapidfuzz``'s normalised Indel ratio), what a translator's memory tool suggests; on a split that
  leaks near-duplicates it scores high without translating anything.

``near_duplicate_rate`` measures that leak: the fraction of held-out sources with a training source at least
``threshold`` similar.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Score:
    """A corpus BLEU (0-100), its sacreBLEU signature, and the length ratio of hypotheses to references."""

    bleu: float
    signature: str
    length_ratio: float

    def __str__(self) -> str:
        return f"BLEU {self.bleu:.2f} (length ratio {self.length_ratio:.2f}; {self.signature})"


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> Score:
    """sacreBLEU's corpus BLEU with its default 13a tokenisation, on detokenised text.

    Raises:
        ValueError: if the two lists differ in length or are empty.
    """
    import sacrebleu  # imported here: importing text stays light

    if len(hypotheses) != len(references) or not references:
        raise ValueError(f"bleu: {len(hypotheses)} hypotheses for {len(references)} references; need equal, > 0")
    metric = sacrebleu.BLEU()
    result = metric.corpus_score(list(hypotheses), [list(references)])
    return Score(round(result.score, 2), str(metric.get_signature()), round(result.sys_len / result.ref_len, 3))


def copy_source(sources: Sequence[str]) -> list[str]:
    """The copy baseline: each source as its own translation."""
    return list(sources)


def _nearest(train_sources: Sequence[str], sources: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """For each source the index of the most similar training source and that similarity (0-100)."""
    from rapidfuzz import fuzz, process

    scores = process.cdist(list(sources), list(train_sources), scorer=fuzz.ratio, dtype=np.uint8, workers=1)
    best = scores.argmax(axis=1)                                                  # (n,) ties -> lower index
    return best, scores[np.arange(len(sources)), best]


def translation_memory(train_sources: Sequence[str], train_targets: Sequence[str], sources: Sequence[str]
                       ) -> list[str]:
    """The translation-memory baseline: the target of the most similar training source, for each source."""
    best, _ = _nearest(train_sources, sources)
    return [train_targets[i] for i in best]


def near_duplicate_rate(train_sources: Sequence[str], sources: Sequence[str], threshold: int = 90) -> float:
    """The fraction of ``sources`` whose most similar training source is at least ``threshold`` (0-100) similar."""
    _, similarity = _nearest(train_sources, sources)
    return float((similarity >= threshold).mean())
