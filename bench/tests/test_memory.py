"""The memory workload (``bench.memory``): each subject in its own process, one record per (workload, dtype,
subject), the peer beside ours where it runs the workload, and the report's table; not how much."""

from __future__ import annotations

import json

import numpy as np

from bench import report, run, targets


def test_every_subject_has_its_own_peak(tmp_path):
    ballast = np.ones(2**27)  # 1 GiB in this process, touched: a worker must not report it as its own
    run.main(["--framework", "torch", "--workloads", "memory", "--config", "tiny", "--dtypes", "bfloat16",
              "--batch", "2", "--src-len", "8", "--tgt-len", "8", "--new-tokens", "4,8", "--threads", "1",
              "--out", str(tmp_path)])
    runs = [json.loads((tmp_path / "bench-torch.json").read_text())]
    recs = targets.records(runs, "memory")
    assert sorted((r["of"], r["subject"].startswith("impl_")) for r in recs) == sorted(
        [("forward", True), ("forward", False), ("greedy", True), ("beam", True), ("train", True), ("train", False)])
    assert all(ballast.nbytes / 2**20 > r["metrics"]["peak_rss_mb"] >= r["metrics"]["framework_rss_mb"] > 0
               for r in recs), recs
    table = targets.memory_table(runs)
    assert table.count("| torch |") == 4 and "torch.nn.Transformer" in table
    assert "## Peak memory" in report.report(runs, [])
