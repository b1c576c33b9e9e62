"""The shared subword tokenizer: exact round trips, the config's special ids, deterministic training, and load
errors that name the file."""

from __future__ import annotations

import gettext
import re
from pathlib import Path

import numpy as np
import pytest

from spec.config import TINY
from text.tokenizer import Tokenizer

VOCAB = 400
WORDS = ("Datei", "Größe", "öffnen", "schließen", "Verzeichnis", "nicht", "gefunden", "über", "Straße", "Fehler",
         "file", "could", "not", "open", "directory", "size", "the", "of", "»%s«", "„%d“", "'%s'", "\"x\"", "42",
         "2024", "3.14", "100%", "🎉", "€", "—", "→", "naïve", "café", "Ärger", "Übel", "ÖL")
CATALOGS = Path("/usr/share/locale/de/LC_MESSAGES")


def sentences(n: int, seed: int = 0) -> list[str]:
    """n synthetic single-line sentences of 1 to 12 words drawn from WORDS."""
    rng = np.random.default_rng(seed)
    return [" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), rng.integers(1, 13))) for _ in range(n)]


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    return Tokenizer.train(sentences(1500), tmp_path_factory.mktemp("tok") / "tokenizer.model", VOCAB)


def test_round_trip_is_exact_for_seen_and_unseen_text(tok):
    unseen = ["Schöne Grüße aus Köln: 3 × 7 = 21 ✓", "日本語のテキスト 😀", "  two  spaces, leading and trailing  ",
              "Ωμέγα ∑ ∞ ≠ ≤", "tab-free <s> </s> <pad> <unk> <0x41> literals", "a", "ß"]
    assert tok.round_trip_failures(sentences(300, seed=1) + unseen) == []


def test_specials_are_the_configs_and_encode_adds_none(tok):
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.vocab_size == VOCAB and tok.path.name == "tokenizer.model"
    ids = tok.encode(["Datei nicht gefunden", "🎉"])
    assert all(ids) and not {0, 1, 2, 3} & {i for row in ids for i in row}


def test_decode_cuts_at_the_first_eos_and_drops_pad_and_bos(tok):
    a, b = tok.encode(["Größe »%s« über 42", "Straße"])
    rows = np.zeros((2, len(a) + 6), np.int64)                      # (B, L) padded with pad_id 0
    rows[0, :len(a) + 3] = [1, *a, 2, b[0]]                          # BOS + ids + EOS + junk after EOS
    rows[1, :len(b)] = b                                             # no EOS: up to the padding
    assert tok.decode(rows) == ["Größe »%s« über 42", "Straße"]
    assert tok.decode([[*b, 2, *a]]) == ["Straße"]
    assert tok.decode([]) == []


def test_decode_and_encode_refuse_bad_input(tok):
    with pytest.raises(ValueError, match=f"row 1 holds id {VOCAB}"):
        tok.decode([[5], [5, VOCAB]])
    with pytest.raises(ValueError, match="row 0 is not a sequence of int ids"):
        tok.decode([5, 6])                                           # one row given flat
    with pytest.raises(ValueError, match="not one str"):
        tok.encode("Datei")
    with pytest.raises(ValueError, match="sentence 1 is a int"):
        tok.encode(["Datei", 3])


def test_training_is_deterministic(tmp_path):
    text = sentences(800, seed=2)
    a = Tokenizer.train(text, tmp_path / "a.model", 350)
    b = Tokenizer.train(list(text), tmp_path / "b.model", 350)
    assert a.path.read_bytes() == b.path.read_bytes()
    assert Tokenizer.train(text[:-1], tmp_path / "c.model", 350).path.read_bytes() != a.path.read_bytes()


def test_train_takes_the_special_ids_of_a_config(tmp_path):
    config = TINY.replace(vocab_size=340, pad_id=2, bos_id=0, eos_id=5)
    tok = Tokenizer.train(sentences(300), tmp_path / "t.model", 340, config=config)
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (2, 0, 5, 1)
    assert Tokenizer.load(tok.path, config).vocab_size == 340
    with pytest.raises(ValueError, match="vocab_size 400 differs from config.vocab_size 340"):
        Tokenizer.train(sentences(300), tmp_path / "u.model", 400, config=config)


@pytest.mark.parametrize("bad, name", [("a\nb", "a newline"), ("a\tb", "a tab"), ("a\rb", "a carriage return")])
def test_train_refuses_multiline_sentences_naming_the_index(tmp_path, bad, name):
    with pytest.raises(ValueError, match=f"sentence 2 holds {name}"):
        Tokenizer.train(["eins", "zwei", bad], tmp_path / "t.model", 300)
    assert not (tmp_path / "t.model").exists()


def test_train_refuses_a_vocabulary_too_small_for_specials_and_bytes(tmp_path):
    with pytest.raises(ValueError, match="vocab_size 260 is too small: 4 special pieces and 256 byte pieces"):
        Tokenizer.train(sentences(50), tmp_path / "t.model", 260)
    with pytest.raises(ValueError, match="no text"):
        Tokenizer.train(["", ""], tmp_path / "t.model", 300)
    with pytest.raises(ValueError, match=r"model_type must be one of \('bpe', 'unigram'\), got 'char'"):
        Tokenizer.train(sentences(50), tmp_path / "t.model", 300, model_type="char")


def test_a_small_vocabulary_spells_rare_characters_in_bytes(tmp_path):
    # 400 distinct characters, each rarer than any of 'ab ', with room for only 40 of them: SentencePiece's
    # default coverage (99.95%) would need them all; the trainer lowers it and the rest fall back to bytes.
    rare = [chr(0x4E00 + i) for i in range(400)]
    text = ["ab " * 40 + c for c in rare]
    tok = Tokenizer.train(text, tmp_path / "t.model", 300)
    assert tok.vocab_size == 300 and tok.round_trip_failures(text) == []
    with pytest.raises(ValueError, match=r"give vocab_size >= \d+"):
        Tokenizer.train(["".join(rare)] * 3, tmp_path / "u.model", 300)   # no character is common: 98% needs ~390


def test_train_names_too_little_text_for_the_vocabulary(tmp_path):
    with pytest.raises(ValueError, match="SentencePiece could not train 5000 pieces on 3 sentences"):
        Tokenizer.train(["eins zwei", "drei", "vier"], tmp_path / "t.model", 5000)


def test_load_errors_name_the_path(tok, tmp_path):
    missing = tmp_path / "missing.model"
    with pytest.raises(ValueError, match=f"{re.escape(str(missing))}: no such file"):
        Tokenizer.load(missing)
    garbage = tmp_path / "garbage.model"
    garbage.write_bytes(b"\x00not a sentencepiece model\xff" * 10)
    with pytest.raises(ValueError, match=f"{re.escape(str(garbage))}: not a SentencePiece model"):
        Tokenizer.load(garbage)
    with pytest.raises(ValueError, match=f"{re.escape(str(tok.path))} has {VOCAB} pieces, the model's config "
                                         f"expects vocab_size 61"):
        Tokenizer.load(tok.path, TINY)
    with pytest.raises(ValueError, match=re.escape(f"{tok.path}: special ids differ") + ".*'eos_id': \\(2, 4\\)"):
        Tokenizer.load(tok.path, TINY.replace(vocab_size=VOCAB, eos_id=4))
    assert Tokenizer.load(tok.path, TINY.replace(vocab_size=VOCAB)).encode(["Datei"]) == tok.encode(["Datei"])


@pytest.mark.skipif(not (CATALOGS / "coreutils.mo").is_file(), reason="no German gettext catalogs here")
def test_round_trip_on_real_catalog_text(tmp_path):
    text = []
    for name in ("coreutils.mo", "grep.mo", "tar.mo", "sed.mo", "bash.mo"):
        if (CATALOGS / name).is_file():
            with open(CATALOGS / name, "rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog
            for msgid, msgstr in catalog.items():
                for s in (msgid[0] if isinstance(msgid, tuple) else msgid, msgstr):
                    s = re.sub(r"\s+", " ", s).strip()      # as the corpus layer collapses whitespace
                    if s:
                        text.append(s)
    tok = Tokenizer.train(text, tmp_path / "t.model", 1000)
    assert len(text) > 1000 and tok.round_trip_failures(text) == []
