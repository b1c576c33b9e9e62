"""The translation workload (``--workloads translate``) at ``tiny``: in torch's environment a whole run, every
system's record from a worker process of its own, with its memory; in jax's and tf's the worker of ours alone, in
this process; not how fast."""

from __future__ import annotations

import json

import pytest

from bench import run, translate_run, translate_worker
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
