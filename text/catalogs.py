"""Parallel text from the gettext message catalogs of installed software
(``/usr/share/locale/<lang>/LC_MESSAGES/*.mo``): English msgid, translated msgstr, as ``text.corpus``'s ``Pair``s.
They are read with ``polib``; a string that is not in its catalog's declared charset is counted and left out, never
decoded wrongly.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from text.corpus import Pair, Read

LOCALE_DIR = Path("/usr/share/locale")


def catalog_files(target_lang: str, locale_dir: str | os.PathLike = LOCALE_DIR) -> list[Path]:
    """The gettext catalogs translating English into ``target_lang`` (``<locale_dir>/<lang>/LC_MESSAGES/*.mo``)."""
    return sorted((Path(locale_dir) / target_lang / "LC_MESSAGES").glob("*.mo"))


def read_catalogs(target_lang: str, locale_dir: str | os.PathLike = LOCALE_DIR,
                  files: Sequence[Path] | None = None) -> Read:
    """English -> ``target_lang`` pairs from gettext catalogs: msgid and msgstr (a plural entry's singular forms).

    Each string is read as bytes and decoded in its catalog's declared charset: one that fails (or that is valid
    UTF-8 beyond ASCII in a catalog declaring a Latin charset, the mislabelling found in practice) is counted in
    ``skipped`` as "<catalog>: not in its declared charset <charset>", with its pair left out.

    Raises:
        ValueError: if there is no catalog for ``target_lang`` (naming the folder searched).
    """
    import polib  # imported here: only this reader needs it

    files = catalog_files(target_lang, locale_dir) if files is None else list(files)
    if not files:
        raise ValueError(f"{Path(locale_dir) / target_lang / 'LC_MESSAGES'}: no gettext catalog (*.mo) for "
                         f"{target_lang!r}; give a corpus as plain files instead (--source/--target or --tsv)")
    read = Read([])
    for path in files:
        mo = polib.mofile(str(path), encoding="latin-1")         # latin-1 maps every byte to a char: lossless
        charset = _charset(mo.metadata.get("Content-Type", ""))
        for entry in mo:
            target = entry.msgstr_plural.get(0, "") if entry.msgid_plural else entry.msgstr
            decoded = [_decode(s, charset) for s in (entry.msgid, target)]
            if None in decoded:
                read.skipped[f"{path.name}: not in its declared charset {charset}"] += 1
            else:
                read.pairs.append(Pair(decoded[0], decoded[1], path.name))
    return read


def _charset(content_type: str) -> str:
    match = re.search(r"charset=([\w.:-]+)", content_type)
    return match.group(1).lower() if match else "utf-8"


def _decode(latin1: str, charset: str) -> str | None:
    """A string polib read as latin-1, decoded in ``charset``; None if its bytes are not in that charset."""
    raw = latin1.encode("latin-1")
    try:
        text = raw.decode(charset)
    except (UnicodeDecodeError, LookupError):
        return None
    if charset.replace("_", "-") in ("iso-8859-1", "latin1", "latin-1", "iso-8859-15") and not raw.isascii():
        try:
            raw.decode("utf-8")
            return None                                          # UTF-8 bytes under a Latin label
        except UnicodeDecodeError:
            pass
    return text
