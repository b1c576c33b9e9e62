"""The shared source-target subword vocabulary (Vaswani et al., 2017, section 5.1): a SentencePiece BPE model.

One model encodes both languages, so the tied embedding and output projection (section 3.4) share its ids. The
model is trained for exact round trips: identity normalization (no Unicode folding), whitespace kept as written,
and byte fallback, so a character the vocabulary lacks is spelled as its UTF-8 bytes instead of becoming unk.
The one string that does not come back is U+2581 (``▁``), SentencePiece's own whitespace mark, which decodes as a
space. Pad, BOS and EOS hold the model config's ids; unk takes the lowest id left.

    tok = Tokenizer.train(sentences, "tokenizer.model", vocab_size=8000)
    tok = Tokenizer.load("tokenizer.model", config)         # checks vocab_size and special ids against config
    ids = tok.encode(["Datei »%s« nicht gefunden"])         # [[...]]: subword ids, no BOS/EOS
    tok.decode(tokens)                                      # (B, L) ids -> text, cut at the first EOS
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm

from spec.config import Config
from text.tokenizer_training import SPECIALS, check_strings, train_model


class Tokenizer:
    """A loaded SentencePiece model: ``encode`` text to subword ids and ``decode`` ids to text.

    Build one with ``Tokenizer.train`` or ``Tokenizer.load``.
    """

    def __init__(self, processor: spm.SentencePieceProcessor, path: str | os.PathLike):
        self._sp, self._path = processor, Path(path)
        self.pad_id, self.bos_id = processor.pad_id(), processor.bos_id()
        self.eos_id, self.unk_id = processor.eos_id(), processor.unk_id()

    @property
    def path(self) -> Path:
        """The model file."""
        return self._path

    @property
    def vocab_size(self) -> int:
        """The number of pieces, specials and byte pieces included: the model's V."""
        return self._sp.get_piece_size()

    # ------------------------------------------------------------------ building

    @classmethod
    def train(cls, sentences: Iterable[str], path: str | os.PathLike, vocab_size: int, *,
              config: Config | None = None, model_type: str = "bpe", num_threads: int = 1) -> Tokenizer:
        """Train a model of ``vocab_size`` pieces on ``sentences`` (both languages) and write it to ``path``.

        Deterministic: the same sentences and arguments give the same file, byte for byte. Where the characters
        covering 99.95% of the text do not fit beside the specials and byte pieces, the coverage is lowered (to
        98% at most, SentencePiece's limit) and the rarer characters are spelled in bytes.

        Raises:
            ValueError: an empty corpus; a sentence that is not a str or holds a newline, tab or carriage return
                (naming its index); an unknown ``model_type``; ``vocab_size`` differing from ``config.vocab_size``
                or too small for the specials, the 256 byte pieces and the text's characters; or SentencePiece
                refusing the corpus (e.g. too little text for ``vocab_size`` pieces), with its message.
        """
        train_model(sentences, path, vocab_size, config=config, model_type=model_type, num_threads=num_threads)
        return cls.load(path, config)

    @classmethod
    def load(cls, path: str | os.PathLike, config: Config | None = None) -> Tokenizer:
        """The model in ``path``; with ``config``, checked to fit it.

        Raises:
            ValueError: naming ``path``: a missing file; a file that is not a SentencePiece model; pad, BOS or
                EOS undefined; with ``config``, a piece count other than ``config.vocab_size`` or special ids
                other than the config's.
        """
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"{path}: no such file; train a tokenizer first (python -m text prepare)")
        try:
            sp = spm.SentencePieceProcessor(model_proto=path.read_bytes())
        except RuntimeError as e:
            raise ValueError(f"{path}: not a SentencePiece model ({e})") from None
        tok = cls(sp, path)
        undefined = [name for name in SPECIALS if getattr(tok, name) < 0]
        if undefined:
            raise ValueError(f"{path}: the model defines no {', '.join(undefined)}; train it with Tokenizer.train")
        if config is not None:
            if tok.vocab_size != config.vocab_size:
                raise ValueError(f"{path} has {tok.vocab_size} pieces, the model's config expects vocab_size "
                                 f"{config.vocab_size}")
            differ = {n: (getattr(tok, n), getattr(config, n)) for n in SPECIALS
                      if getattr(tok, n) != getattr(config, n)}
            if differ:
                raise ValueError(f"{path}: special ids differ from the config's (tokenizer, config): {differ}")
        return tok

    # ------------------------------------------------------------------ using

    def encode(self, sentences: Sequence[str]) -> list[list[int]]:
        """Each sentence's subword ids, without BOS or EOS.

        Raises:
            ValueError: if ``sentences`` is a single str, or an item is not a str (naming its index).
        """
        check_strings(sentences, "Tokenizer.encode")
        return self._sp.encode(list(sentences), out_type=int)

    def decode(self, ids: Any) -> list[str]:
        """The text of each row of ``ids`` (a (B, L) int array, or a sequence of id sequences).

        A row is cut at its first EOS; pad and BOS are dropped (search output starts with no BOS, but a row given
        as tgt_in does).

        Raises:
            ValueError: naming the row: not a 1-D sequence of ints, or an id outside [0, vocab_size).
        """
        rows = []
        for r, row in enumerate(ids):
            a = np.asarray(row)
            if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
                raise ValueError(f"Tokenizer.decode: row {r} is not a sequence of int ids (shape {a.shape}, "
                                 f"dtype {a.dtype}); give a (B, L) int array or a list of id lists")
            ends = np.flatnonzero(a == self.eos_id)
            a = a[:ends[0]] if ends.size else a
            a = a[(a != self.pad_id) & (a != self.bos_id)]
            bad = a[(a < 0) | (a >= self.vocab_size)]
            if bad.size:
                raise ValueError(f"Tokenizer.decode: row {r} holds id {int(bad[0])}, outside [0, {self.vocab_size})")
            rows.append(a.tolist())
        return self._sp.decode(rows) if rows else []

    def round_trip_failures(self, sentences: Sequence[str]) -> list[tuple[int, str, str]]:
        """(index, original, decoded) for each sentence that ``decode(encode(s))`` does not give back."""
        decoded = self.decode(self.encode(sentences))
        return [(i, s, d) for i, (s, d) in enumerate(zip(sentences, decoded, strict=True)) if s != d]

    def __repr__(self) -> str:
        return f"Tokenizer({str(self._path)!r}, vocab_size={self.vocab_size})"
