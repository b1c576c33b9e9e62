"""Certifying an implementation written elsewhere (docs/certify.md): the suite run as its users run it, from a
folder outside the repository with ``--backend`` an import path, on a small selection of checks each.

A wrong adapter fails the checks that see its one contract violation; impl_torch through the import path gets what
the built-in name gets; the template adapter passes what it supports and reports the rest as not supported.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# The template with one violation of spec.numerics rule 7: logits rounded to bf16.
ROUNDED_LOGITS = '''
import ml_dtypes
import numpy as np

from conformance.examples import template_adapter as template


class RoundedLogits(template.TemplateModel):
    def forward(self, src, tgt_in, intermediates=False, dropout_seed=None):
        logits, inter = super().forward(src, tgt_in, intermediates, dropout_seed)
        return logits.astype(ml_dtypes.bfloat16).astype(np.float32), inter


class Backend(template.TemplateBackend):
    def load(self, path):
        return RoundedLogits(*template.load_weights(path))


def make_backend():
    return Backend()
'''
TINY_FORWARD = "golden_forward and forward_tiny"  # five golden cases of the tiny model, bf16 and fp32, in seconds


def suite(folder: Path, backend: str, *args: str) -> dict:
    """The JSON report of ``pytest --pyargs conformance --backend <backend> <args>`` run in ``folder``, which is
    also on the path (a user's adapter lies there). The plugin comes from the installed suite's entry point; in a
    checkout where the suite is not installed, from ``-p``."""
    folder.mkdir(exist_ok=True)
    installed = importlib.metadata.entry_points(group="pytest11", name="aiayn_conformance")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = folder / "reports"
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "conformance", "--backend", backend, "--report-dir", str(out),
           "-q", "-p", "no:cacheprovider", *["-p", "conformance.plugin"] * (not installed),
           *args]
    proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, check=False)
    reports = list(out.glob("conformance-*.json"))
    assert len(reports) == 1, f"no report; pytest said:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(reports[0].read_text())


def outcomes(report: dict) -> dict[str, str]:
    return {check: e["outcome"] for check, e in report["checks"].items()}


def test_a_wrong_adapter_fails_the_checks_that_see_its_violation(tmp_path):
    (tmp_path / "rounded_logits.py").write_text(ROUNDED_LOGITS)
    report = suite(tmp_path, "rounded_logits", "-k", TINY_FORWARD)
    judged = {c: e["message"] for c, e in report["checks"].items() if e["outcome"] in ("passed", "failed")}
    failed = {c: m for c, m in judged.items() if report["checks"][c]["outcome"] == "failed"}
    assert judged and failed == judged, outcomes(report)  # every case it runs
    # fp32 models by the logits' error bound; in bf16 models the rounding stays within the tiny model's logits
    # tolerance, and the lower bound on fp32 logits (spec.agreement.BF16_LOGITS_MAX) sees it
    bf16 = {c for c in failed if "bfloat16" in c.split("_params")[0]}  # the activations' dtype
    assert bf16 and len(bf16) < len(failed), sorted(failed)
    assert all("logits" in failed[c] and "out of tolerance" in failed[c] for c in set(failed) - bf16), failed
    assert all("are bf16 values" in failed[c] for c in bf16), failed


def test_an_impl_through_its_import_path_is_its_built_in_name(tmp_path):
    pytest.importorskip("impl_torch")
    chosen = "-k", f"({TINY_FORWARD}) or bad_input_forward or round_trip or api_names"
    by_name = suite(tmp_path / "name", "torch", *chosen)
    by_path = suite(tmp_path / "path", "conformance.adapters.backend_torch", *chosen)
    assert outcomes(by_path) == outcomes(by_name) and len(by_name["checks"]) > 10
    assert set(outcomes(by_name).values()) == {"passed"}
    assert ({c: e["tensors"] for c, e in by_path["checks"].items()}
            == {c: e["tensors"] for c, e in by_name["checks"].items()})  # the same errors, to the last bit


def test_the_template_passes_what_it_supports_and_no_more(tmp_path):
    report = suite(tmp_path, "conformance.examples.template_adapter",
                   "-k", "forward_tiny or weights or causality or greedy")
    got = outcomes(report)
    assert "failed" not in got.values() and "skipped" not in got.values(), got
    assert got["golden_forward[forward_tiny_float32]"] == got["causality[bfloat16]"] == "passed"
    messages = {c: e["message"] for c, e in report["checks"].items()}
    assert messages["golden_forward[forward_tiny_prenorm_bfloat16]"] == "not supported: pre-LN layers (norm_first)"
    assert messages["golden_greedy[greedy_tiny_float32]"].startswith("not supported: the backend does not support")
    assert messages["weights_round_trip_bit_exact[float32]"] == "not supported: the backend does not support save"


def test_a_random_config_failure_replays_on_the_backend_given_as_an_import_path():
    """The replay call a random-config failure prints names the ``--backend`` given, and ``replay`` loads it the
    way the plugin does: a built-in name or an import path."""
    from conformance import test_random_configs as rc
    from spec.config import TINY

    ex = rc.Example(TINY, 0, np.array([[5, 6, 2]]), np.array([[1, 7]]))
    path = "conformance.adapters.backend_reference"
    assert f"backend={path!r}" in ex.replay_call(path)
    out = rc.replay(TINY.to_json(), 0, [[5, 6, 2]], [[1, 7]], backend=path)
    assert not out.problems and out.logits is not None and out.logits.ok
