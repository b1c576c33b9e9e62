"""Readers, cleaning and the near-duplicate-free split (``text.corpus``), on small corpora made here."""

from __future__ import annotations

import random

import polib
import pytest

from text import catalogs, corpus
from text.corpus import Pair


def _write(path, text: str | bytes):
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return path


def test_parallel_files_give_pairs_with_their_origin(tmp_path):
    src = _write(tmp_path / "a.en", "Open file\nClose »x«\n")
    tgt = _write(tmp_path / "a.de", "Datei öffnen\r\n»x« schließen\n")
    read = corpus.read_parallel(src, tgt)
    assert [(p.source, p.target) for p in read.pairs] == [("Open file", "Datei öffnen"), ("Close »x«", "»x« schließen")]
    assert read.pairs[1].origin == f"{src}:2"


@pytest.mark.parametrize("make, message", [
    (lambda d: (d / "missing.en", _write(d / "b.de", "x\n")), "missing.en: no such file"),
    (lambda d: (_write(d / "a.en", "x\ny\n"), _write(d / "b.de", "x\n")), "has 2 lines and"),
    (lambda d: (_write(d / "a.en", "x\n"), _write(d / "b.de", b"ok\nGr\xfc\xdfe\n")), "b.de:2: not UTF-8 (byte 0xfc"),
    (lambda d: (_write(d / "a.en", ""), _write(d / "b.de", "")), "a.en: empty corpus"),
])
def test_parallel_files_refuse_bad_input_naming_file_and_line(tmp_path, make, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        corpus.read_parallel(*make(tmp_path))


def test_tsv_needs_exactly_two_fields(tmp_path):
    assert corpus.read_tsv(_write(tmp_path / "c.tsv", "a\tb\n")).pairs == [Pair("a", "b", f"{tmp_path}/c.tsv:1")]
    with pytest.raises(ValueError, match=r"c.tsv:2: expected source<TAB>target, found 3"):
        corpus.read_tsv(_write(tmp_path / "c.tsv", "a\tb\na\tb\tc\n"))


def _catalog(path, charset: str, entries: list[tuple[str, str]]):
    po = polib.POFile()
    po.metadata = {"Content-Type": f"text/plain; charset={charset}", "Content-Transfer-Encoding": "8bit"}
    po.encoding = charset.split(";")[0]
    for msgid, msgstr in entries:
        po.append(polib.POEntry(msgid=msgid, msgstr=msgstr))
    po.save_as_mofile(str(path))


def test_catalogs_count_strings_outside_their_declared_charset(tmp_path):
    folder = tmp_path / "de" / "LC_MESSAGES"
    folder.mkdir(parents=True)
    _catalog(folder / "good.mo", "UTF-8", [("Open file", "Datei öffnen"), ("Quit", "Beenden")])
    _catalog(folder / "latin.mo", "ISO-8859-1", [("Size", "Größe")])
    mislabelled = folder / "mislabelled.mo"       # declares Latin-1, holds one UTF-8 string (as net-tools once did)
    _catalog(mislabelled, "UTF-8;X", [("Size", "Größe"), ("Name", "Name2")])     # the label swapped, same length:
    mislabelled.write_bytes(mislabelled.read_bytes().replace(b"charset=UTF-8;X", b"charset=latin-1"))
    read = catalogs.read_catalogs("de", tmp_path)
    assert {(p.source, p.target, p.origin) for p in read.pairs} == {
        ("Open file", "Datei öffnen", "good.mo"), ("Quit", "Beenden", "good.mo"), ("Size", "Größe", "latin.mo"),
        ("Name", "Name2", "mislabelled.mo")}
    assert read.skipped == {"mislabelled.mo: not in its declared charset latin-1": 1}
    with pytest.raises(ValueError, match="no gettext catalog"):
        catalogs.read_catalogs("xx", tmp_path)


def test_cleaning_counts_each_rule_and_keeps_the_rest():
    pairs = [Pair("Open  file\n", "Datei öffnen", "1"), Pair("", "leer", "2"), Pair("GNOME", "GNOME", "3"),
             Pair("%s: %d", "%s: %d.", "4"), Pair("word " * 81, "Wort", "5"), Pair("Open file", "Datei öffnen", "6"),
             Pair("Quit", "Beenden", "7")]
    kept, counts = corpus.clean(pairs)
    assert [(p.source, p.origin) for p in kept] == [("Open file", "1"), ("Quit", "7")]
    assert counts == {"whitespace": 2, "empty": 1, "identical": 1, "format_only": 1, "too_long": 1,
                      "duplicate": 1, "kept": 2}
    kept, counts = corpus.clean(pairs, rules=("empty",))           # a user may change the rules
    assert counts["kept"] == 6
    with pytest.raises(ValueError, match="unknown rule"):
        corpus.clean(pairs, rules=("empty", "typos"))


def _templates(n: int, seed: int) -> list[Pair]:
    """n pairs from templates: each template's variants differ in one word, as catalog messages do."""
    rng = random.Random(seed)
    words = sorted({"".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=6)) for _ in range(400)})
    pairs = []
    while len(pairs) < n:
        stem = rng.sample(words, 4)
        for verb in rng.sample(["open", "remove", "read", "write", "close"], rng.randint(1, 4)):
            pairs.append(Pair(f"could not {verb} {' '.join(stem)} %s", f"{verb}-de {' '.join(stem)}", "t"))
    return pairs[:n]


def test_near_duplicates_stay_on_one_side():
    pairs = _templates(3000, 0)
    parts = corpus.split(pairs, dev=0.1, test=0.1)
    side = {p.source: name for name in ("train", "dev", "test") for p in getattr(parts, name)}
    assert sum(len(getattr(parts, s)) for s in ("train", "dev", "test")) == len(pairs)
    by_stem: dict[str, set[str]] = {}
    for p in pairs:
        by_stem.setdefault(p.source.split(" ", 3)[3], set()).add(side[p.source])
    assert all(len(s) == 1 for s in by_stem.values())
    assert 0.05 < len(parts.test) / len(pairs) < 0.15 and 0.05 < len(parts.dev) / len(pairs) < 0.15


def test_the_split_does_not_move_when_unrelated_pairs_are_added_or_the_order_changes():
    pairs = _templates(2000, 1)
    before = corpus.split(pairs)
    rng = random.Random(3)
    more = pairs + [Pair(" ".join(rng.choices(["alpha", "beta", "gamma", "delta", "omega"], k=7)), "andere", "new")
                    for _ in range(500)]
    random.Random(2).shuffle(more)
    after = corpus.split(more)
    for name in ("train", "dev", "test"):
        old = set(getattr(before, name))
        assert old <= set(getattr(after, name))


def test_signatures_link_one_word_substitutions_and_insertions():
    assert corpus.signatures('could not open file "%s"') & corpus.signatures('could not remove file "%s"')
    assert corpus.signatures("could not open file") & corpus.signatures("could not open the file")
    assert not corpus.signatures("could not open file") & corpus.signatures("the disk is full")
    assert corpus.skeleton("Copied 12 files to »%s«.") == ["copied", "0", "files", "to", "%"]
