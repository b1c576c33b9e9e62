"""A byte-level BPE vocabulary for one stream of text (GPT-2's scheme; Radford et al., 2019), for the decoder-only
model: the ``tokenizers`` library's BPE over the 256 byte symbols, trained locally.

Every string round-trips exactly: text is split into UTF-8 bytes before the merges apply, so no character is
unknown and nothing is normalised. Pad, BOS and EOS hold the config's ids (0, 1, 2 by default) as reserved entries
that encoding never produces: their names lie outside the byte alphabet, so no merge can spell them, and
``encode_special_tokens`` makes a literal occurrence of a name in the text plain bytes.

    bpe = ByteLevelBPE.train(texts, vocab_size=2048)
    ids = bpe.encode("Return the absolute value")     # [...]: no BOS/EOS
    bpe.decode(ids)                                   # the text again; cut at the first EOS, pad and BOS dropped
    bpe.save("bpe.json"); ByteLevelBPE.load("bpe.json", config)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from spec.config import Config

SPECIALS = ("pad_id", "bos_id", "eos_id")
DEFAULT_IDS = {f.name: f.default for f in dataclasses.fields(Config) if f.name in SPECIALS}
# Angle brackets U+27E8/U+27E9 are not among the byte-level symbols, so no merge of bytes can spell these names.
NAMES = {"pad_id": "\u27e8pad\u27e9", "bos_id": "\u27e8bos\u27e9", "eos_id": "\u27e8eos\u27e9"}


class ByteLevelBPE:
    """A trained byte-level BPE: ``encode`` text to ids and ``decode`` ids to text. Build one with ``train`` or
    ``load``."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, names: dict[str, str] | None = None):
        tokenizer.encode_special_tokens = True  # a reserved name written in the text is text, not the reserved id
        self._tok = tokenizer
        ids = {name: tokenizer.token_to_id((names or NAMES)[name]) for name in SPECIALS}
        self.pad_id, self.bos_id, self.eos_id = (ids[name] for name in SPECIALS)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, config: Config | None = None) -> ByteLevelBPE:
        """Learn ``vocab_size`` entries (the reserved three, the 256 bytes, then merges) from ``texts``.

        Raises:
            ValueError: if ``config``'s special ids are not 0, 1 and 2 in some order (the trainer puts reserved
                entries first), or ``vocab_size`` leaves no room for a merge.
        """
        order = _reserved_order(config)
        if vocab_size <= len(order) + 256:
            raise ValueError(f"vocab_size {vocab_size} leaves no merge beside 3 reserved ids and 256 bytes")
        tok = tokenizers.Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[NAMES[n] for n in order],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator(texts, trainer)
        return cls(tok)

    @classmethod
    def load(cls, path: str | os.PathLike, config: Config | None = None) -> ByteLevelBPE:
        """The tokenizer saved at ``path``.

        Raises:
            ValueError: naming the file, if ``config`` is given and its vocab_size or special ids differ.
        """
        bpe = cls(tokenizers.Tokenizer.from_file(str(path)))
        if config is not None:
            want = {"vocab_size": config.vocab_size, **{n: getattr(config, n) for n in SPECIALS}}
            have = {"vocab_size": bpe.vocab_size, **{n: getattr(bpe, n) for n in SPECIALS}}
            if want != have:
                raise ValueError(f"{path}: the tokenizer's {have} differ from the config's {want}")
        return bpe

    @classmethod
    def from_gpt2(cls, folder: str | os.PathLike, config: Config) -> ByteLevelBPE:
        """GPT-2's tokenizer (``vocab.json`` and ``merges.txt`` in ``folder``) for the model ``config`` that
        ``spec.convert.gpt2`` made of the same checkpoint: EOS is its ``<|endoftext|>``, and the rows the
        conversion appended for pad and BOS get reserved names.

        Raises:
            ValueError: naming a missing file, or a vocabulary that is not the config's less its appended rows.
        """
        folder = Path(folder)
        files = [folder / "vocab.json", folder / "merges.txt"]
        if not all(f.is_file() for f in files):
            raise ValueError(f"{folder}: no vocab.json and merges.txt (GPT-2's tokenizer)")
        tok = tokenizers.Tokenizer(models.BPE.from_file(*map(str, files)))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        V = tok.get_vocab_size()
        appended = sorted((n for n in SPECIALS if getattr(config, n) >= V), key=lambda n: getattr(config, n))
        if V + len(appended) != config.vocab_size or config.eos_id >= V:
            raise ValueError(f"{files[0]}: {V} ids; the model has vocab_size {config.vocab_size} with "
                             f"{len(appended)} appended rows and eos_id {config.eos_id}")
        tok.add_special_tokens([NAMES[n] for n in appended])
        return cls(tok, {n: NAMES[n] if n in appended else tok.id_to_token(getattr(config, n)) for n in SPECIALS})

    def save(self, path: str | os.PathLike) -> Path:
        self._tok.save(str(path))
        return Path(path)

    def to_str(self) -> str:
        """The tokenizer as the JSON ``save`` writes."""
        return self._tok.to_str()

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``, without BOS or EOS."""
        return self._tok.encode(text).ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` up to the first EOS, pad and BOS left out."""
        ids = [int(i) for i in ids]
        if self.eos_id in ids:
            ids = ids[:ids.index(self.eos_id)]
        return self._tok.decode([i for i in ids if i not in (self.pad_id, self.bos_id)], skip_special_tokens=False)

    def tokens(self, ids: Sequence[int]) -> list[str]:
        """Each id's text alone (a merge may end inside a character: its bytes show as U+FFFD)."""
        return [self._tok.decode([int(i)], skip_special_tokens=False) for i in ids]


def _reserved_order(config: Config | None) -> list[str]:
    ids = {n: getattr(config, n) for n in SPECIALS} if config is not None else DEFAULT_IDS
    if sorted(ids.values()) != [0, 1, 2]:
        raise ValueError(f"the reserved ids must be 0, 1 and 2 in some order, got {ids}")
    return sorted(SPECIALS, key=ids.get)
