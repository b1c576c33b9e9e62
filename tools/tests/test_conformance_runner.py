"""tools.conformance: backends chosen and checked, a passing and a failing pytest per backend, logs and reports."""

from __future__ import annotations

import pytest

from tools import conformance


def test_an_unknown_backend_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        conformance.main(["--report-dir", str(tmp_path), "numpy"])
    assert "unknown backend numpy" in capsys.readouterr().err


def test_a_backend_runs_and_leaves_its_report_and_log(tmp_path, capsys):
    assert conformance.main(["--report-dir", str(tmp_path), "reference", "--", "-k", "empty_batch"]) == 0
    out = capsys.readouterr().out
    assert "reference: passed" in out and "1 of 1 backends passed" in out
    assert (tmp_path / "pytest-reference.log").exists() and list(tmp_path.glob("conformance-reference*.json"))


def test_a_failing_backend_fails_the_run_and_shows_its_log(tmp_path, capsys):
    assert conformance.main(["--report-dir", str(tmp_path), "reference", "--", "--no-such-option"]) == 1
    out = capsys.readouterr().out
    assert "reference: FAILED" in out and "no-such-option" in out and "failed: reference" in out
