"""One licence for the project: the text at the root, the same SPDX expression in every package's metadata, and a
citation of the paper."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_declares_the_licence_of_the_root():
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    packages = sorted(ROOT.glob("*/pyproject.toml"))
    names = {p.parent.name for p in packages}
    assert names >= {"spec", "conformance", "impl_torch", "impl_jax", "impl_tf", "text", "bench"}, names
    for p in packages:
        assert tomllib.loads(p.read_text())["project"]["license"] == "Apache-2.0", p


def test_the_citation_file_cites_the_paper():
    text = (ROOT / "CITATION.cff").read_text()
    assert "cff-version: 1.2.0" in text and "Attention Is All You Need" in text and "arXiv:1706.03762" in text
