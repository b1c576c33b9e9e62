"""``python -m certify`` end to end on one adapter and a few checks: ``torch.nn.Transformer`` (fp32 and bf16 by
casting) must pass the fp32 output projection, fail the bf16 one (it rounds the logits to bf16) with its measured
cause in the table, and report a golden case whose heads it cannot express as not supported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]
CHECKS = {"golden_layer[layer_output_projection_float32]": "passed",
          "golden_layer[layer_output_projection_bfloat16]": "failed",
          "golden_forward[forward_tiny_float32]": "not supported"}


def test_certify_one_adapter_on_a_few_checks(tmp_path):
    out = tmp_path / "certified.md"
    subset = " or ".join(c.split("[")[1].rstrip("]") for c in CHECKS)
    subprocess.run([sys.executable, "-m", "certify", "--only", "nn_transformer", "--out", str(out),
                    "--report-dir", str(tmp_path), "--", "-k", subset], cwd=ROOT, check=True, timeout=300)
    report = json.loads((tmp_path / "conformance-certify.adapters.nn_transformer-partial.json").read_text())
    got = {c: report["checks"][c]["outcome"] for c in CHECKS}
    assert got == CHECKS
    table = out.read_text()
    golden = next(line for line in table.splitlines() if line.startswith("| `nn_transformer` | golden |"))
    assert golden.split("|")[4].strip() == "1"                                   # the one failure, counted
    assert "returns bf16 (measured dtype torch.bfloat16)" in table
    assert "nn.MultiheadAttention's heads are d_model / n_heads" in table
