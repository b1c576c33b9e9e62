"""The README stays one screen of what to run and what it gives, and each figure in it comes from a report."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench import report
from spec.api import BACKENDS

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
MAX_LINES = 150


def test_the_readme_is_at_most_150_lines():
    assert len(README.splitlines()) <= MAX_LINES


def test_the_speed_section_is_the_bench_results_rendered():
    """Between the bench markers: exactly what ``bench.report`` writes from bench/results/bench.json."""
    runs = json.loads((ROOT / "bench" / "results" / "bench.json").read_text())
    section = re.search(re.escape(report.BEGIN) + r"\n\n(.*?)\n\n" + re.escape(report.END), README, re.S)
    assert section, "the README has no bench section"
    assert section.group(1) == "\n".join(report.readme_lines(runs, "docs/speed.md"))


def test_the_translation_figures_are_the_demos():
    """Test BLEU of the averaged checkpoints and the training pairs, from docs/translate/translate-demo.json."""
    demo = json.loads((ROOT / "docs" / "translate" / "translate-demo.json").read_text())
    bleu = {s: demo["test"][s]["averaged"]["bleu"] for s in (*BACKENDS, "peer")}
    claim = re.search(r"torch ([\d.]+), jax ([\d.]+), tf\s+([\d.]+), the stock `torch.nn.Transformer` ([\d.]+)",
                      README)
    assert claim, "the README no longer states the demo's BLEU"
    assert [float(x) for x in claim.groups()] == list(bleu.values())
    assert f"{demo['corpus']['split']['train']:,}" in README


def test_the_language_model_figures_are_the_demos():
    """Held-out losses as docs/lm_demo.md's table gives them (rounded to 3 decimals in the README)."""
    rows = dict(re.findall(r"^\| impl_(\w+) \| bfloat16 \| ([\d.]+) \|", (ROOT / "docs" / "lm_demo.md").read_text(),
                           re.M))
    claim = re.search(r"([\d.]+) \(torch\),\s+([\d.]+) \(jax\), ([\d.]+) \(tf\) nats", README)
    assert claim, "the README no longer states the language model's losses"
    assert [float(x) for x in claim.groups()] == [round(float(rows[b]), 3) for b in BACKENDS]


def test_the_gpu_column_is_the_h200_report():
    """torch's count on the H200 is its report's."""
    gpu = (ROOT / "docs" / "gpu" / "conformance-h200.md").read_text()
    torch_passed = re.search(r"^- torch \([^)]*\): (\d+) passed, 0 failed", gpu, re.M)
    row = re.search(r"^\| `torch` \| [^|]+ \| [^|]+ \| (\d+)/(\d+)[^|]*\|", README, re.M)
    assert torch_passed and row and row.group(1) == torch_passed.group(1)
