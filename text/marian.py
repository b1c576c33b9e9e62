"""The tokenizer of a Marian checkpoint folder (``source.spm``, ``target.spm``, ``vocab.json``), as
``transformers.MarianTokenizer`` reads it, with the interface of ``text.tokenizer.Tokenizer``; with
``spec.convert.marian.load`` a published Marian model translates in any backend (``python -m text translate
--marian FOLDER``).

Marian splits text with one SentencePiece model per language and numbers the pieces by its own ``vocab.json``,
shared by both sides: a piece the vocabulary lacks becomes ``<unk>``. Multilingual models' language codes
(``>>de<<``) and separate source and target vocabularies are not read here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm

from spec.config import Config

FILES = ("source.spm", "target.spm", "vocab.json")
SPECIALS = ("</s>", "<unk>", "<pad>")


class MarianTokenizer:
    """Source text -> ids with the source model, ids -> text with the target model. Build with ``load``."""

    def __init__(self, source: spm.SentencePieceProcessor, target: spm.SentencePieceProcessor,
                 vocab: dict[str, int], config: Config):
        self._source, self._target, self._vocab = source, target, vocab
        self._pieces = {i: piece for piece, i in vocab.items()}
        self.unk_id, self.eos_id, self.pad_id, self.bos_id = vocab["<unk>"], config.eos_id, config.pad_id, config.bos_id

    @classmethod
    def load(cls, folder: str | os.PathLike, config: Config) -> MarianTokenizer:
        """The tokenizer in ``folder``, for the model ``config`` converted from the same folder.

        Raises:
            ValueError: naming a missing file, a special token missing from ``vocab.json``, or a vocabulary whose
                ids do not fit ``config`` (EOS, pad, or more ids than the model has).
        """
        folder = Path(folder)
        missing = [f for f in FILES if not (folder / f).is_file()]
        if missing:
            raise ValueError(f"{folder}: no {missing} (a Marian tokenizer is {list(FILES)})")
        vocab = json.loads((folder / "vocab.json").read_text())
        absent = [s for s in SPECIALS if s not in vocab]
        if absent:
            raise ValueError(f"{folder / 'vocab.json'} lacks {absent}")
        fits = max(vocab.values()) < config.vocab_size
        if (vocab["</s>"], vocab["<pad>"]) != (config.eos_id, config.pad_id) or not fits:
            raise ValueError(f"{folder / 'vocab.json'}: eos {vocab['</s>']}, pad {vocab['<pad>']}, {len(vocab)} ids; "
                             f"the model has eos_id {config.eos_id}, pad_id {config.pad_id}, vocab_size "
                             f"{config.vocab_size}")
        source, target = (spm.SentencePieceProcessor(model_file=str(folder / f)) for f in FILES[:2])
        return cls(source, target, vocab, config)

    def encode(self, sentences: Sequence[str]) -> list[list[int]]:
        """Each sentence's ids, without EOS (``text.translate.source_ids`` appends it)."""
        if isinstance(sentences, str):
            raise ValueError("MarianTokenizer.encode: give a sequence of sentences, not one str")
        return [[self._vocab.get(p, self.unk_id) for p in self._source.encode(s, out_type=str)] for s in sentences]

    def decode(self, ids: Any) -> list[str]:
        """The text of each row of ``ids`` (B, L): cut at its first EOS; pad, BOS and the special pieces dropped,
        as ``MarianTokenizer.batch_decode(..., skip_special_tokens=True)``."""
        out = []
        for row in ids:
            a = np.asarray(row)
            ends = np.flatnonzero(a == self.eos_id)
            pieces = [self._pieces[i] for i in (a[:ends[0]] if ends.size else a).tolist() if i in self._pieces]
            text = self._target.decode_pieces([p for p in pieces if p not in SPECIALS])
            out.append(text.replace("\u2581", " ").strip())
        return out
