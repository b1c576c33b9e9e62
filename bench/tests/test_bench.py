"""The speed bench runs on each framework (``bench``): every encoder-decoder workload at the ``tiny`` config, once.

It checks that the bench measures what it says (every workload recorded, the step counts asked for, the
searches run their full length), not how fast: timings belong to ``nox -s bench``'s reports.
"""

from __future__ import annotations

import importlib
import json
import re

import numpy as np
import pytest

from bench import decoding_run, report, run
from bench.common import bench_params, inputs
from spec.config import TINY


@pytest.fixture(scope="module")
def bench_run(framework, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    fw = framework
    # decoder-only, translation, memory, paper batch: test_lm_bench.py, test_translate.py, test_memory.py
    workloads = ",".join(w for w in run.WORKLOADS if w not in ("lm", "translate", "memory", "paper_batch"))
    run.main(["--framework", fw, "--out", str(out), "--workloads", workloads, "--config", "tiny", "--repeats", "1",
              "--batch", "2", "--src-len", "5", "--tgt-len", "6", "--new-tokens", "3,9", "--lengths", "4,8",
              "--matmul", "8,8,8"])
    report.main([str(out / f"bench-{fw}.json"), "--out", str(out)])
    return fw, out, json.loads((out / f"bench-{fw}.json").read_text())


def test_every_workload_is_recorded(bench_run):
    fw, _, data = bench_run
    workloads = {r["workload"] for r in data["records"]}
    assert workloads == {"matmul", "forward", "greedy", "greedy_steps", "beam", "train", "scaling"}
    subjects = {r["subject"] for r in data["records"] if r["workload"] == "forward"}
    assert f"impl_{fw}" in subjects and len(subjects) == 2, subjects  # ours and the stock peer
    for r in data["records"]:
        if "timing" in r:
            assert 0 < r["timing"]["median_s"] and r["timing"]["repeats"] >= 1, r
    assert data["environment"]["framework"] == fw
    assert {"cpu", "cores", "date"} <= data["environment"]["machine"].keys()  # every chart's footnote names them
    # The training step: ours and the stock peer's own, each in mixed precision and fp32, fp32 master weights.
    trains = [r for r in data["records"] if r["workload"] == "train"]
    assert sorted((r["subject"], r["dtype"]) for r in trains) == sorted(
        (s, d) for s in subjects for d in ("bfloat16", "float32")), trains
    assert all("timing" in r and r["param_dtype"] == "float32" for r in trains)
    assert len({r["flops"] for r in trains}) == 1  # the same count for every subject: rates compare
    # The product rate at the start and again at the end; utilisation divides by the faster of the two.
    rates = [r for r in data["records"] if r["workload"] == "matmul"]
    assert sorted(r["dtype"] for r in rates) == ["bfloat16", "bfloat16", "float32", "float32"]
    assert report.matmul_rates([data], fw)["float32"] == max(r["metrics"]["flop_per_s"] for r in rates
                                                       if r["dtype"] == "float32")


def test_generation_runs_the_steps_asked_for(bench_run):
    _, _, data = bench_run
    for r in (r for r in data["records"] if r["workload"] == "greedy_steps"):
        assert len(r["cached_step_s"]) == 9 and len(r["recomputed_step_s"]) == 3
        assert r["metrics"]["cache_speedup"] > 0
        assert 3 <= len(r["cache_speedup_rounds"]) == len(r["step_growth_rounds"]) <= decoding_run.MAX_STEP_ROUNDS


def test_report_writes_tables_and_charts(bench_run):
    fw, out, data = bench_run
    md = (out / "bench.md").read_text()
    assert f"| impl_{fw} |" in md
    row = next(line for line in md.split("## Targets", 1)[1].splitlines() if line.startswith(f"| impl_{fw} |"))
    cells = row.strip("| ").split(" | ")[1:]                     # every target: median [low, high] verdict
    assert len(cells) == 7 and all(re.match(r"\d+\.\d\d× \[\d+\.\d\d, \d+\.\d\d\] (✓|✗|undecided)", c)
                                   for c in cells), row
    training = md.split("## Training step", 1)[1]
    assert {r["subject"] for r in data["records"] if r["workload"] == "train"} == set(
        re.findall(r"^\| ([^|]+?) \| (?:bfloat16|float32) \|", training, re.M)), training
    for workload in ("forward", "greedy", "beam", "train", "scaling"):
        assert (out / f"bench-{workload}.png").stat().st_size > 0


def test_searches_run_their_full_length(framework):
    """The bench's weights zero the EOS row: its logit is exactly 0 and the largest of the others is positive,
    so no hypothesis ends early and tokens per second count every step asked for."""
    params = bench_params(TINY)
    assert not params["embedding"][TINY.eos_id].any()
    T = importlib.import_module(f"impl_{framework}")  # through its public API (spec.api), as the bench runs it
    model = T.from_params(TINY, params)
    src, _ = inputs(TINY, 3, 7, 1)
    for tokens in (T.greedy_search(model, src, max_new_tokens=12), T.beam_search(model, src, max_new_tokens=12)):
        tokens = np.asarray(tokens)
        assert tokens.shape == (3, 12) and not (tokens == TINY.eos_id).any(), tokens


def test_a_full_run_rewrites_the_speed_sections(bench_run, tmp_path):
    fw, out, data = bench_run
    doc, readme = tmp_path / "docs" / "speed.md", tmp_path / "README.md"
    doc.parent.mkdir()
    for f in (doc, readme):
        f.write_text(f"kept\n{report.BEGIN}\nstale\n{report.END}\nkept too\n")
    # the paths given, none derived from where the bench is installed (a wheel's would lie in site-packages)
    report.update_doc(doc, readme, tmp_path / "results", [data], out)
    for f in (doc, readme):
        text = f.read_text()
        assert "stale" not in text and text.startswith("kept\n") and text.endswith("kept too\n"), text
        assert f"| impl_{fw} |" in text.split("## ", 1)[0]         # the targets row
    assert "[docs/speed.md](docs/speed.md)" in readme.read_text()
    assert (tmp_path / "results" / "bench.md").exists()
