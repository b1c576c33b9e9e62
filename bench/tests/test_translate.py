"""The translation workload (``--workloads translate``) at ``tiny``: in torch's environment a whole run, every
system's record from a worker process of its own, with its memory; in jax's and tf's the worker of ours alone, in
this process; the report's memory verdicts from every run's peak; not how fast."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench import run, translate_report, translate_run, translate_worker
from bench import translate_common as tc


def test_a_run_starts_each_system_in_its_own_process(tmp_path):
    pytest.importorskip("bench.translate_peers")
    run.main(["--framework", "torch", "--out", str(tmp_path), "--workloads", "translate", "--config", "tiny",
              "--dtypes", "float32", "--translate-batches", "32", "--translate-rounds", "1", "--repeats", "1",
              "--threads", "1"])
    records = json.loads((tmp_path / "bench-torch.json").read_text())["records"]
    systems = [(r["workload"], r["system"], r["dtype"]) for r in records]
    expect = [("ours", "float32"), *translate_run.peers("torch", ["float32"])]
    assert systems == [(f"translate_{m}", s, d) for m in ("greedy", "beam") for s, d in expect]
    for r in records:
        assert r["dims"] == {"B": 32, "sentences": 64, "new_tokens": tc.NEW_TOKENS,
                             "beam_size": 1 if r["workload"] == "translate_greedy" else tc.BEAM_SIZE}
        assert r["metrics"]["tokens_per_s"] > 0 and r["metrics"]["peak_rss_mb"] >= r["metrics"]["framework_rss_mb"]
        # The same function and search: greedy in fp32, and Marian's beam (no row ends, so its length penalty
        # ranks as ours); CTranslate2's beam search lets ended hypotheses hold beams, int8 is another function.
        same = r["dtype"] == "float32" and (r["workload"] == "translate_greedy" or r["system"] != "ctranslate2")
        assert r["same_translations_as_ours"] is True if same else r["same_translations_as_ours"] in (True, False)


@pytest.mark.parametrize("mode", ["greedy", "beam"])
def test_the_worker_translates_with_ours(framework, mode, capsys):
    if framework == "torch":
        pytest.skip("torch's worker runs in the whole run above")
    translate_worker.main(["--framework", framework, "--system", "ours", "--dtype", "bfloat16", "--config", "tiny",
                           "--batch", "16", "--mode", mode, "--repeats", "1"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["subject"] == f"impl_{framework}" and len(out["times_s"]) == 1
    assert out["tokens"] == 64 * tc.NEW_TOKENS and len(out["translations"]) == 16
    assert all(len(row) == tc.NEW_TOKENS for row in out["translations"])


def _record(system: str, peaks: list[float], times: list[float]) -> dict:
    """A translate_greedy record at B=1 in float32; one peak: a record written before each run's peak was kept."""
    rec = {"workload": "translate_greedy", "dims": {"B": 1}, "system": system, "framework": "torch",
           "subject": "impl_torch" if system == "ours" else system, "dtype": "float32", "times_s": times,
           "metrics": {"tokens_per_s": 100 / float(np.median(times)), "peak_rss_mb": max(peaks)}}
    return {**rec, "peak_rss_runs_mb": peaks} if len(peaks) > 1 else rec


@pytest.mark.parametrize("ours, marian, verdict", [
    ([600, 610, 605, 604, 603], [900, 950, 920, 921, 930], "0.66× [0.63, 0.68] ✓"),
    ([600, 610, 605], [600, 950, 920], "0.66× [0.63, 1.02] undecided"),   # a run of Marian's below ours' highest
    ([960, 961, 962], [900, 950, 920], "1.04× [1.01, 1.07] ✗"),
    ([600, 610], [900, 950], "0.65× [0.63, 0.68] undecided: 2 runs"),
    ([600], [900], "0.67× [0.67, 0.67] undecided: 1 run"),              # a record of one figure (older JSON)
])
def test_the_memory_verdict_rests_on_each_runs_peak(ours, marian, verdict):
    times = [1.0] * 5
    lines = translate_report.targets([_record("ours", ours, times), _record("transformers", marian, times)])
    assert len(lines) == 1 and f"peak memory / Marian's {verdict}" in lines[0], lines


def test_a_speed_ratio_of_unpaired_rounds_is_undecided():
    lines = translate_report.targets([_record("ours", [600], [1.0] * 5), _record("transformers", [900], [2.0] * 3)])
    assert "2.00x Marian's tokens/s (undecided: 5 and 3 rounds, not paired)" in lines[0], lines
