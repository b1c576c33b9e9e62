"""The memory workload (``bench.memory``): each subject in its own process, one record per (workload, dtype,
subject), the peer beside ours where it runs the workload, and the report's table; not how much."""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from bench import memory, paper_batch, profile, report, run, targets, verdict


def test_every_subject_has_its_own_peak(tmp_path):
    ballast = np.ones(2**27)  # 1 GiB in this process, touched: a worker must not report it as its own
    run.main(["--framework", "torch", "--workloads", "memory", "--config", "tiny", "--dtypes", "bfloat16",
              "--batch", "2", "--src-len", "8", "--tgt-len", "8", "--new-tokens", "4,8", "--threads", "1",
              "--memory-runs", "1", "--out", str(tmp_path)])
    runs = [json.loads((tmp_path / "bench-torch.json").read_text())]
    recs = targets.records(runs, "memory")
    assert sorted((r["of"], r["subject"].startswith("impl_")) for r in recs) == sorted(
        [("forward", True), ("forward", False), ("greedy", True), ("beam", True), ("train", True), ("train", False)])
    assert all(len(r["peak_rss_runs_mb"]) == 1 and r["metrics"]["peak_rss_mb"] == np.median(r["peak_rss_runs_mb"])
               and ballast.nbytes / 2**20 > max(r["peak_rss_runs_mb"])
               and min(r["peak_rss_runs_mb"]) >= r["metrics"]["framework_rss_mb"] > 0 for r in recs), recs
    table = targets.memory_table(runs)
    assert table.count("| torch |") == 4 and "torch.nn.Transformer" in table
    assert table.count("undecided: 1 run |") == 2, table        # one process each decides nothing
    assert "## Peak memory" in report.report(runs, [])


def test_a_memory_verdict_has_its_runs_by_default(tmp_path, monkeypatch):
    """By default every subject runs in MIN_RUNS processes, a round taking each subject in turn, and its record
    keeps every process's peak (``alone`` here a stand-in counting the processes it was asked for)."""
    started = []

    def alone(a, workload, who, dtype, batch):
        started.append((workload, who))
        return {"subject": "impl_torch" if who == "ours" else "peer", "peak_rss_mb": 100.0 + len(started),
                "framework_rss_mb": 50.0}

    monkeypatch.setattr(memory, "alone", alone)
    run.main(["--framework", "torch", "--workloads", "memory", "--config", "tiny", "--dtypes", "float32",
              "--out", str(tmp_path)])
    recs = json.loads((tmp_path / "bench-torch.json").read_text())["records"]
    assert len(started) == 6 * verdict.MIN_RUNS and started[:6] == started[6:12], started
    assert [r["peak_rss_runs_mb"] for r in recs[:2]] == [[101.0, 107.0, 113.0], [102.0, 108.0, 114.0]]
    assert recs[0]["metrics"] == {"peak_rss_mb": 107.0, "framework_rss_mb": 50.0}
    assert run.parser().get_default("translate_rounds") == verdict.MIN_ROUNDS


def test_paper_batch_records_each_batch_and_a_process_that_fails(tmp_path, monkeypatch):
    run.main(["--framework", "torch", "--workloads", "paper_batch", "--config", "tiny", "--src-len", "8",
              "--tgt-len", "8", "--paper-forward-batches", "1,4", "--paper-train-batches", "1,2,4",
              "--threads", "1", "--out", str(tmp_path)])
    runs = [json.loads((tmp_path / "bench-torch.json").read_text())]
    recs = targets.records(runs, "paper_batch")
    assert [(r["of"], r["dims"]["B"]) for r in recs] == [("forward", 1), ("forward", 4), ("train", 1), ("train", 2),
                                                           ("train", 4)]
    assert all(len(r["timing"]["times_s"]) == paper_batch.RUNS - 1 and r["metrics"]["peak_rss_mb"] > 0
               for r in recs), recs
    section = report.report(runs, [])
    assert section.count("| torch | forward |") == 2 and section.count("| torch | train |") == 3, section
    assert "at the paper's batch (B = 3125)" in section, section      # 25,000 source tokens of S = 8
    # A process that dies (as the kernel ends one for want of memory) is a row saying so, not a lost run.
    monkeypatch.setattr(paper_batch, "alone", lambda *_: {"error": "killed", "returncode": -9})
    run.main(["--framework", "torch", "--workloads", "paper_batch", "--config", "tiny", "--paper-forward-batches",
              "2", "--paper-train-batches", "2", "--out", str(tmp_path)])
    runs = [json.loads((tmp_path / "bench-torch.json").read_text())]
    assert "| torch | train | 2 | 256 | exited with -9 |" in report.report(runs, [])


def test_the_profile_breaks_down_ours_and_the_peer(capsys):
    tiny = ["--config", "tiny", "--batch", "2", "--src-len", "8", "--tgt-len", "8", "--threads", "1"]
    for framework, workload, who in (("torch", "forward", "ours"), ("torch", "forward", "peer"),
                                     ("jax", "forward", "ours"), ("jax", "forward", "peer"),
                                     ("jax", "train", "ours"), ("jax", "train", "peer")):
        profile.main(["--framework", framework, "--workload", workload, "--subject", who, "--rows", "5", *tiny])
        out = capsys.readouterr().out
        if framework == "torch":
            assert "Self CPU" in out and "CPU Mem" in out, out
            continue
        mib = {k: float(v) for k, v in (kv.split(" ") for kv in out.split(": ")[1].split(", "))}
        assert mib["argument"] > 0 and (workload == "train" or mib["temp"] > 0), out
        if (workload, who) == ("train", "peer"):
            assert mib["alias"] == mib["argument"], out   # the peer donates its parameters and optimiser state


def test_a_subject_short_of_memory_dies_before_the_run_that_started_it():
    a = argparse.Namespace(framework="torch", config="tiny", src_len=8, tgt_len=8, new_tokens=[4], threads=1)
    out = memory.alone(a, "forward", "ours", "float32", 2)
    if os.path.exists(memory.OOM_SCORE_ADJ):
        assert out["oom_score_adj"] == "1000", out


def _memory(subject: str, of: str, peaks: list[float]) -> dict:
    """A memory record in bfloat16; one peak: a record written before each run's peak was kept."""
    rec = {"framework": "torch", "workload": "memory", "subject": subject, "dtype": "bfloat16", "of": of,
           "dims": {"B": 8}, "metrics": {"peak_rss_mb": max(peaks), "framework_rss_mb": 300.0}}
    return {**rec, "peak_rss_runs_mb": peaks} if len(peaks) > 1 else rec


def test_the_memory_table_judges_the_median_and_every_runs_peak():
    peer = "torch.nn.Transformer"
    recs = [_memory("impl_torch", "forward", [690, 700, 695]), _memory(peer, "forward", [720, 710, 730]),
            _memory("impl_torch", "train", [1800, 1900, 1850]), _memory(peer, "train", [1850, 1870, 2000]),
            _memory("impl_torch", "greedy", [600, 601, 602])]
    table = targets.memory_table([{"environment": {"framework": "torch"}, "records": recs}])
    assert "| torch | forward | bfloat16 | 695 | 300 | torch.nn.Transformer | 720 | 0.97× [0.95, 0.99] ✓ |" in table
    assert "| 1,850 | 300 | torch.nn.Transformer | 1,870 | 0.99× [0.90, 1.03] undecided |" in table, table
    assert "| torch | greedy | bfloat16 | 601 | 300 | — | — | — |" in table, table
    old = [_memory("impl_torch", "forward", [690]), _memory("torch.nn.Transformer", "forward", [720])]
    table = targets.memory_table([{"environment": {"framework": "torch"}, "records": old}])
    assert "| 690 | 300 | torch.nn.Transformer | 720 | 0.96× [0.96, 0.96] undecided: 1 run |" in table, table
