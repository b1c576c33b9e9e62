"""tools.conformance: backends chosen and checked, a passing and a failing pytest per backend, logs and reports."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

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


def _report(backend: str, checks: dict[str, tuple[str, str]]) -> dict:
    """A per-backend report as conformance/conftest.py writes it: {check: (family, outcome)}."""
    return {"backend": backend, "describe": "", "duration_s": 1.0, "partial": False, "collected": len(checks),
            "filter": "", "checks": {c: {"family": f, "outcome": o, "message": "", "module": f"test_{f}.py",
                                         "tensors": [], "duration": 0.1} for c, (f, o) in checks.items()}}


def test_the_combined_report_gives_the_verdict_first_in_backend_order(tmp_path, capsys):
    import json

    from conformance import report

    impl = {"golden_forward[a]": ("golden", "passed"), "golden_forward[b]": ("golden", "passed"),
            "api_names": ("api", "passed")}
    files = []
    for backend, checks in [("tf", impl), ("jax", {**impl, "golden_forward[b]": ("golden", "failed")}),
                            ("torch", impl), ("reference", {k: v for k, v in impl.items() if k != "api_names"})]:
        files.append(tmp_path / f"conformance-{backend}.json")
        files[-1].write_text(json.dumps(_report(backend, checks)))
    assert report.main([str(f) for f in files]) == 1                          # jax failed a check
    out = capsys.readouterr().out
    verdicts = [out.index(f"{b}: ") for b in ("reference", "torch", "jax", "tf")]
    assert verdicts == sorted(verdicts) and verdicts[-1] < out.index("Conformance report")  # verdict on top
    assert "api_names" not in out                     # passed wherever it ran: one family line, the reference "-"
    assert "golden_forward[b]" in out and "golden_forward[a]" in out          # a failure opens its family


def test_golden_training_cases_are_training_checks():
    from conformance import report

    assert report.family_of("golden_train[train_tiny_float32]", "test_golden.py") == "training"
    assert report.family_of("golden_forward[forward_tiny_float32]", "test_golden.py") == "golden"
    assert report.family_of("bad_input_forward[x]", "test_errors.py") == "errors"


def _collected(backend: str) -> int:
    """How many checks the installed suite holds for ``backend`` (pytest's own count, nothing run)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "--pyargs", "conformance", "--backend", backend], capture_output=True, text=True).stdout
    return int(re.search(r"(\d+) tests? collected", out).group(1))


def test_the_readmes_check_counts_are_the_suites():
    """The README's table says how many checks each backend passes on the CPU: the number the suite holds."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    row = rf"^\| `({'|'.join(conformance.BACKENDS)})` \| [^|]+ \| (\d+)/\d+ \|"
    claimed = {b: int(n) for b, n in re.findall(row, readme, re.M)}
    assert set(claimed) == set(conformance.BACKENDS), claimed
    assert claimed == {b: _collected(b) for b in claimed}
