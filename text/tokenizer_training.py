"""Training the SentencePiece model of ``text.tokenizer.Tokenizer`` (``Tokenizer.train``): the corpus checked, the
character coverage fitted to the vocabulary, the model written atomically."""

from __future__ import annotations

import collections
import dataclasses
import io
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm

from spec.config import Config

BYTE_PIECES = 256                 # byte_fallback: one piece per byte value, <0x00> .. <0xFF>
SPECIALS = ("pad_id", "bos_id", "eos_id")
# Config's defaults (pad 0, bos 1, eos 2), used when no config is given.
DEFAULT_IDS = {f.name: f.default for f in dataclasses.fields(Config) if f.name in SPECIALS}
MODEL_TYPES = ("bpe", "unigram")    # SentencePiece's "char" and "word" models ignore vocab_size
# SentencePiece keeps the most frequent characters covering this share of the text as pieces of their own (its
# default); the rest fall back to bytes. It accepts no value below MIN_COVERAGE.
COVERAGE, MIN_COVERAGE = 0.9995, 0.98
# SentencePiece leaves sentences longer than this many bytes out of training (its default, named to count alike).
MAX_SENTENCE_BYTES = 4192
FORBIDDEN = {"\n": "a newline", "\t": "a tab", "\r": "a carriage return"}
WS = "\u2581"                     # SentencePiece's whitespace mark


def train_model(sentences: Iterable[str], path: str | os.PathLike, vocab_size: int, *, config: Config | None,
                model_type: str, num_threads: int) -> None:
    """Write the model ``Tokenizer.train`` describes to ``path``; its checks, in its words.

    Raises:
        ValueError: as ``Tokenizer.train``.
    """
    sentences = _training_sentences(sentences)
    ids = _special_ids(config)
    if model_type not in MODEL_TYPES:
        raise ValueError(f"Tokenizer.train: model_type must be one of {MODEL_TYPES}, got {model_type!r}")
    if config is not None and vocab_size != config.vocab_size:
        raise ValueError(f"Tokenizer.train: vocab_size {vocab_size} differs from config.vocab_size "
                         f"{config.vocab_size}")
    meta = len(SPECIALS) + 1                                       # pad, bos, eos and unk
    if not isinstance(vocab_size, int) or vocab_size <= meta + BYTE_PIECES:
        raise ValueError(f"Tokenizer.train: vocab_size {vocab_size} is too small: {meta} special pieces and "
                         f"{BYTE_PIECES} byte pieces (byte fallback) come first; give at least "
                         f"{meta + BYTE_PIECES + 1}, and some thousands for subwords")
    coverage = _character_coverage(sentences, vocab_size - meta - BYTE_PIECES, vocab_size)
    writer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=writer, model_type=model_type,
            vocab_size=vocab_size, character_coverage=coverage, byte_fallback=True,
            normalization_rule_name="identity", remove_extra_whitespaces=False,
            max_sentence_length=MAX_SENTENCE_BYTES, num_threads=num_threads, minloglevel=2,
            unk_id=_lowest_free(ids.values()), **ids)
    except RuntimeError as e:
        raise ValueError(f"Tokenizer.train: SentencePiece could not train {vocab_size} pieces on "
                         f"{len(sentences)} sentences: {e}") from None
    processor = spm.SentencePieceProcessor(model_proto=writer.getvalue())
    if processor.get_piece_size() != vocab_size:
        raise ValueError(f"Tokenizer.train: SentencePiece made {processor.get_piece_size()} pieces, not "
                         f"{vocab_size}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(writer.getvalue())
    os.replace(tmp, path)                          # a reader never sees half a model


def check_strings(sentences: Any, where: str) -> None:
    """Refuse a single str or an item that is not a str (naming its index), in ``where``'s words.

    Raises:
        ValueError: as said.
    """
    if isinstance(sentences, str):
        raise ValueError(f"{where}: give a sequence of sentences, not one str")
    for i, s in enumerate(sentences):
        if not isinstance(s, str):
            raise ValueError(f"{where}: sentence {i} is a {type(s).__name__}, not a str")


def _training_sentences(sentences: Iterable[str]) -> list[str]:
    """The sentences as a list, checked to be single-line strs.

    Raises:
        ValueError: on an empty corpus, or naming the first sentence that is not a str or holds a line or field
            separator (the corpus layer collapses whitespace; one here means a reading error).
    """
    sentences = list(sentences) if not isinstance(sentences, str) else sentences
    check_strings(sentences, "Tokenizer.train")
    for i, s in enumerate(sentences):
        for ch, name in FORBIDDEN.items():
            if ch in s:
                raise ValueError(f"Tokenizer.train: sentence {i} holds {name} ({s[:60]!r}); sentences must be single "
                                 f"lines with whitespace collapsed")
    if not any(sentences):
        raise ValueError("Tokenizer.train: no text to train on")
    return sentences


def _special_ids(config: Config | None) -> dict[str, int]:
    return dict(DEFAULT_IDS) if config is None else {name: getattr(config, name) for name in SPECIALS}


def _lowest_free(taken: Iterable[int]) -> int:
    taken = set(taken)
    return next(i for i in range(len(taken) + 1) if i not in taken)


def _character_coverage(sentences: list[str], room: int, vocab_size: int) -> float:
    """The character_coverage for SentencePiece: ``COVERAGE``, or less where the characters it needs would not fit
    in ``room`` pieces.

    Counts characters as SentencePiece does (spaces as ``▁``, one ``▁`` prefixed to each sentence, long sentences
    left out); the coverage of k characters is the share of the text that the k most frequent ones make up.

    Raises:
        ValueError: if even ``MIN_COVERAGE`` needs more characters than ``room``.
    """
    counts: collections.Counter[str] = collections.Counter()
    kept = [s for s in sentences if s and len(s.encode("utf-8")) <= MAX_SENTENCE_BYTES]
    for s in kept:
        counts.update(s.replace(" ", WS))
    counts[WS] += len(kept)
    cum = np.cumsum(sorted(counts.values(), reverse=True)) / sum(counts.values())   # coverage of the top k + 1
    need = int(np.searchsorted(cum, COVERAGE)) + 1                 # characters for COVERAGE
    if need <= room:
        return COVERAGE
    if cum[room - 1] < MIN_COVERAGE:
        least = int(np.searchsorted(cum, MIN_COVERAGE)) + 1
        raise ValueError(f"Tokenizer.train: vocab_size {vocab_size} is too small for this text: besides the "
                         f"{vocab_size - room} special and byte pieces, the {least} most frequent of its "
                         f"{len(counts)} characters (98% of it, SentencePiece's least coverage) need pieces; give "
                         f"vocab_size >= {vocab_size - room + least}")
    # float32 (the proto's type) rounded down, so that SentencePiece stops at room characters, not one more.
    cc = np.float32(cum[room - 1])
    return float(np.nextafter(cc, np.float32(0)) if cc > cum[room - 1] else cc)
