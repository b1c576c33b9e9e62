"""Parallel text: readers, cleaning rules that report what they removed, and a split that keeps near-duplicates
on one side.

Three sources, each giving ``Pair``s (source, target, origin):

- ``read_parallel(source_path, target_path)``: two plain UTF-8 files, one sentence per line, line i of one the
  translation of line i of the other;
- ``read_tsv(path)``: one pair per line, source and target separated by one tab;
- ``text.catalogs.read_catalogs(target_lang)``: the gettext message catalogs of installed software
  (``/usr/share/locale/<lang>/LC_MESSAGES/*.mo``): English msgid, translated msgstr.

``clean`` applies named rules in order and counts what each removed; ``split`` assigns each pair to train, dev
or test by a hash of its near-duplicate group, so that a template that differs in one word (``could not open
file "%s"`` / ``could not remove file "%s"``) never has one member in train and another in test.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Pair:
    """One sentence and its translation; ``origin`` says where it came from ("file:line" or a catalog's name)."""

    source: str
    target: str
    origin: str


@dataclasses.dataclass
class Read:
    """What a reader returns: the pairs, and counts of what it could not take (reason -> count)."""

    pairs: list[Pair]
    skipped: collections.Counter = dataclasses.field(default_factory=collections.Counter)


# ----------------------------------------------------------------- readers

def read_lines(path: str | os.PathLike, data: bytes | None = None) -> list[str]:
    """The lines of a UTF-8 text file (or of ``data`` read elsewhere, stdin say, named ``path``), without their
    line ends.

    Raises:
        ValueError: naming the file if it is missing, and the file and line if a line is not UTF-8.
    """
    path = Path(path)
    if data is None and not path.is_file():
        raise ValueError(f"{path}: no such file")
    lines = (path.read_bytes() if data is None else data).split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()                                   # the newline that ends the last line
    out = []
    for i, raw in enumerate(lines, 1):
        try:
            out.append(raw.removesuffix(b"\r").decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}:{i}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                             f"convert the file, e.g. iconv -f LATIN1 -t UTF-8") from None
    return out


def read_parallel(source_path: str | os.PathLike, target_path: str | os.PathLike) -> Read:
    """Two plain UTF-8 files with one sentence per line, aligned by line.

    Raises:
        ValueError: a missing, empty or non-UTF-8 file (naming file and line), or line counts that differ (naming
            both).
    """
    src, tgt = read_lines(source_path), read_lines(target_path)
    if not src:
        raise ValueError(f"{source_path}: empty corpus (no line)")
    if len(src) != len(tgt):
        raise ValueError(f"{source_path} has {len(src)} lines and {target_path} has {len(tgt)}: a parallel corpus "
                         "needs one target line per source line")
    return Read([Pair(s, t, f"{source_path}:{i}") for i, (s, t) in enumerate(zip(src, tgt, strict=True), 1)])


def read_tsv(path: str | os.PathLike) -> Read:
    """One pair per line: source TAB target (UTF-8).

    Raises:
        ValueError: a missing, empty or non-UTF-8 file, or a line without exactly one tab (naming file and line).
    """
    lines = read_lines(path)
    if not lines:
        raise ValueError(f"{path}: empty corpus (no line)")
    pairs = []
    for i, line in enumerate(lines, 1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(f"{path}:{i}: expected source<TAB>target, found {len(fields)} tab-separated fields")
        pairs.append(Pair(fields[0], fields[1], f"{path}:{i}"))
    return Read(pairs)


# ----------------------------------------------------------------- cleaning

FORMAT = re.compile(r"%(\d+\$)?[-+ #0']*(\d+|\*)?(\.(\d+|\*))?(hh|h|ll|l|L|q|j|z|t)?[diouxXeEfFgGaAcspnm%]"
                    r"|\{[^{}]*\}|\$\{?\w+\}?|<[^<>]*>")
WORD = re.compile(r"[^\W\d_]{2,}")
MAX_WORDS = 80


def normalize_whitespace(text: str) -> str:
    """Every run of whitespace (newlines and tabs included) as one space, none at the ends."""
    return " ".join(text.split())


RULES: dict[str, Callable[[Pair, int], bool]] = {
    # name -> removes the pair when true (the duplicate rule is stateful, in ``clean``)
    "empty": lambda p, _: not p.source or not p.target,
    "identical": lambda p, _: p.source == p.target,                     # untranslated (names, codes, commands)
    "format_only": lambda p, _: not WORD.search(FORMAT.sub(" ", p.source)),   # nothing to translate
    "too_long": lambda p, max_words: max(len(p.source.split()), len(p.target.split())) > max_words,
}
DEFAULT_RULES = ("empty", "identical", "format_only", "too_long", "duplicate")


def clean(pairs: Iterable[Pair], rules: Sequence[str] = DEFAULT_RULES, max_words: int = MAX_WORDS
          ) -> tuple[list[Pair], dict[str, int]]:
    """Whitespace normalised, then the named rules in order: -> (kept pairs, {"whitespace": pairs changed,
    rule: pairs it removed, "kept": n}). "duplicate" removes a (source, target) seen before.

    Raises:
        ValueError: naming an unknown rule.
    """
    unknown = [r for r in rules if r not in RULES and r != "duplicate"]
    if unknown:
        raise ValueError(f"clean: unknown rule(s) {unknown}; the rules are {[*RULES, 'duplicate']}")
    counts = dict.fromkeys(["whitespace", *rules], 0)
    kept, seen = [], set()
    for p in pairs:
        q = Pair(normalize_whitespace(p.source), normalize_whitespace(p.target), p.origin)
        counts["whitespace"] += q != p
        removed_by = next((r for r in rules if r != "duplicate" and RULES[r](q, max_words)), None)
        if removed_by is None and "duplicate" in rules:
            removed_by = "duplicate" if (q.source, q.target) in seen else None
            seen.add((q.source, q.target))
        if removed_by:
            counts[removed_by] += 1
        else:
            kept.append(q)
    counts["kept"] = len(kept)
    return kept, counts


# ----------------------------------------------------------------- split

@dataclasses.dataclass(frozen=True)
class Split:
    train: list[Pair]
    dev: list[Pair]
    test: list[Pair]


def skeleton(text: str) -> list[str]:
    """The words a near-duplicate comparison sees: lower case, format specifiers as "%", digits as "0",
    punctuation dropped."""
    text = re.sub(r"\d+", "0", FORMAT.sub(" % ", text.lower()))
    return [w for w in re.split(r"[^\w%]+", text) if w]


def signatures(text: str) -> set[str]:
    """The skeleton, and for three words or more the skeleton with each word in turn replaced by "*" and in turn
    deleted: two sentences that differ in one word, or by one word added, share a signature."""
    words = skeleton(text)
    sigs = {" ".join(words)}
    if len(words) >= 3:
        sigs |= {" ".join([*words[:i], "*", *words[i + 1:]]) for i in range(len(words))}
        sigs |= {" ".join([*words[:i], *words[i + 1:]]) for i in range(len(words))}
    return sigs


def near_duplicate_groups(sources: Sequence[str]) -> list[int]:
    """For each source, the index of its group's first member: sources linked by a shared ``signatures`` entry,
    directly or through others, form one group (union-find)."""
    parent = list(range(len(sources)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, s in enumerate(sources):
        for sig in signatures(s):
            j = owner.setdefault(sig, i)
            a, b = root(i), root(j)
            parent[max(a, b)] = min(a, b)
    return [root(i) for i in range(len(sources))]


def split(pairs: Sequence[Pair], dev: float = 0.02, test: float = 0.03, salt: str = "aiayn",
          max_heldout_group: int = 20) -> Split:
    """Train, dev and test by near-duplicate group: each group goes whole to one side, chosen by the hash of its
    smallest skeleton, so the split is a function of the groups alone (the order of ``pairs`` and unrelated
    additions move nothing). Groups above ``max_heldout_group`` pairs (template families) stay in train: one
    such family would otherwise fill a held-out set with variations of one message.

    Raises:
        ValueError: if ``dev`` or ``test`` is outside [0, 1) or their sum is 1 or more.
    """
    if not (0 <= dev < 1 and 0 <= test < 1 and dev + test < 1):
        raise ValueError(f"split: dev={dev} and test={test} must be fractions summing to less than 1")
    group = near_duplicate_groups([p.source for p in pairs])
    members: dict[int, list[int]] = collections.defaultdict(list)
    for i, g in enumerate(group):
        members[g].append(i)
    sides: dict[str, list[Pair]] = {"train": [], "dev": [], "test": []}
    for idx in members.values():
        key = min(" ".join(skeleton(pairs[i].source)) for i in idx)
        u = int.from_bytes(hashlib.sha256(f"{salt}\0{key}".encode()).digest()[:8], "big") / 2.0 ** 64
        side = ("train" if len(idx) > max_heldout_group or u >= test + dev else "test" if u < test else "dev")
        sides[side].extend(pairs[i] for i in idx)
    return Split(**{k: sorted(v, key=_order) for k, v in sides.items()})


def _order(p: Pair) -> tuple[str, str, str]:
    return p.source, p.target, p.origin
