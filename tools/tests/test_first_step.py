"""``tools.first_step``: a fresh process per backend, a row per length with the first and warm step's seconds."""

from __future__ import annotations

import json
import platform

import pytest

from tools import first_step


def test_the_report_has_a_row_per_backend_and_length(tmp_path):
    first_step.main(["--backends", "torch", "--preset", "tiny", "--batch", "2", "--lengths", "8", "16",
                     "--out", str(tmp_path)])
    record = json.loads((tmp_path / "first-step.json").read_text())
    (run,) = record["runs"]
    assert run["backend"] == "torch" and [r["length"] for r in run["rows"]] == [8, 16]
    glibc = platform.libc_ver()[0] == "glibc"  # the default, --malloc retain, sets glibc's malloc only
    assert run["malloc"] == ({"M_TRIM_THRESHOLD": (1 << 31) - 1, "M_MMAP_MAX": 0, "M_ARENA_MAX": 1} if glibc else {})
    for row in run["rows"]:
        assert row["first_s"] > 0 and row["warm_s"] > 0
        assert row["new_bucket_s"] == row["first_s"] - row["warm_s"]
    table = (tmp_path / "first-step.md").read_text()
    assert "| torch |" in table and record["machine"]["cpu"] in table


def test_a_worker_that_fails_is_reported_with_its_error(tmp_path):
    with pytest.raises(SystemExit, match="(?s)tools.peer_torch failed .*heads are d_model / n_heads"):  # tiny's d_k
        first_step.main(["--backends", "tools.peer_torch", "--preset", "tiny", "--lengths", "8",
                         "--out", str(tmp_path)])
