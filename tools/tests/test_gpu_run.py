"""``tools.gpu_run`` end to end on the CPU at tiny sizes: every part's steps either ran or say why they were not
reached, and the report holds what a GPU run's would."""

from __future__ import annotations

import json

import pytest

from tools import gpu_run
from tools.gpu import parts, speed
from tools.gpu.steps import NOT_REACHED, RAN

STEPS = [("conformance", "jax"), ("bench", "torch-tiny"), ("bench", "jax-tiny"),
         ("decode", "translate-greedy-torch-ours"), ("decode", "translate-greedy-torch-transformers"),
         ("decode", "lm-torch")]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One tiny run, flax taken as absent (as in the ``text`` session, wherever this runs)."""
    out, real = tmp_path_factory.mktemp("gpu"), parts.missing
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parts, "missing", lambda *names: "flax not installed" if "flax" in names else real(*names))
        code = gpu_run.main(["--out", str(out), "--device", "cpu", "--size", "tiny", "--budget-s", "60"])
    return code, out, json.loads((out / "gpu-run.json").read_text())


def test_every_step_ran_or_says_why_not(run):
    code, out, report = run
    assert code == 0, report["steps"]
    assert [(s["part"], s["name"]) for s in report["steps"]] == STEPS
    for s in report["steps"]:
        assert s["status"] in (RAN, NOT_REACHED), s
        assert (s["status"] == RAN) == (s["reason"] is None), s
        if s["status"] == RAN:
            assert (out / s["log"]).exists(), s
    assert any(s["status"] == RAN for s in report["steps"]), report["steps"]
    jax_bench = next(s for s in report["steps"] if s["name"] == "jax-tiny")
    assert (jax_bench["status"], jax_bench["reason"]) == (NOT_REACHED, "flax not installed")


def test_report_holds_the_environment_checks_and_figures(run):
    _, out, report = run
    env = report["environment"]
    assert env["device_name"] == "cpu" and env["cpu"] and env["date"]
    assert {"torch", "jax", "flax"} <= set(env["versions"])
    assert report["peak"]["tflop_per_s"] is None and "omitted" in report["peak"]["note"]
    ran = {s["name"]: s for s in report["steps"] if s["status"] == RAN}
    if "jax" in ran:
        checks = ran["jax"]["checks"]
        assert checks["reached"] == checks["outcomes"].get("passed") == 2 and checks["partial"], checks
    if "torch-tiny" in ran:
        assert {(r["workload"], r["subject"]) for r in report["speed"]} == {
            (w, s) for w in ("forward", "train") for s in ("impl_torch", "torch.nn.Transformer")}
        assert all(r["tflop_per_s"] > 0 and r["share_of_peak"] is None for r in report["speed"])
    decoded = {r["workload"] for r in report["decode"]}
    if "translate-greedy-torch-ours" in ran:
        assert "translate_greedy" in decoded, report["decode"]
    if "lm-torch" in ran:
        assert {"lm_prefill", "lm_decode", "lm_generate"} <= decoded, report["decode"]
    text = (out / "gpu-run.md").read_text()
    assert all(name in text for _, name in STEPS) and "share of peak" in text


@pytest.mark.parametrize(("name", "peak"), [("NVIDIA H200", 989.0), ("NVIDIA H100 PCIe", 756.0),
                                            ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA A100-SXM4-80GB", 312.0),
                                            ("cpu", None)])
def test_peak_by_device_name(name, peak):
    assert speed.peak_bf16(name)[0] == peak


def test_help_shows_defaults(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as done:
        gpu_run.main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "(default: 540.0)" in out and "(default: None)" not in out
