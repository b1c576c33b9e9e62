"""The measured cause of each failure the certification found, by adapter and check name prefix, stated as the
experiment in ``certify.diagnose`` measured it."""

from __future__ import annotations

CAUSES: dict[tuple[str, str], str] = {}


def cause_of(adapter: str, check: str) -> str:
    """The measured cause of ``check`` failing for ``adapter``, or a plain "not diagnosed"."""
    for (a, prefix), cause in CAUSES.items():
        if a == adapter and check.startswith(prefix):
            return cause
    return "not diagnosed"
