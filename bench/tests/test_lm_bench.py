"""The decoder-only workloads (``--workloads lm``) on each framework whose stock GPT-2 installs (transformers for
torch, Flax for jax, keras_hub for tf), at ``lm_tiny``, once: every record, the steps asked for, the report's
tables, and generations of exactly the tokens asked for; not how fast."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest

from bench import lm_report, run
from bench.common import bench_params
from bench.lm_common import lm_config, prompts

PEERS = {"torch": "transformers", "jax": "flax", "tf": "keras_hub"}


@pytest.fixture(scope="module")
def lm(framework) -> str:
    pytest.importorskip(PEERS[framework])
    if not hasattr(importlib.import_module(f"impl_{framework}"), "LanguageModel"):
        pytest.skip(f"impl_{framework} has no LanguageModel yet")
    return framework


@pytest.fixture(scope="module")
def lm_run(lm, tmp_path_factory):
    out = tmp_path_factory.mktemp("lm")
    run.main(["--framework", lm, "--out", str(out), "--workloads", "lm", "--lm-size", "lm_tiny", "--repeats", "1",
              "--lm-batches", "2", "--lm-prompt", "10", "--lm-short", "4", "--lm-steps", "3",
              "--lm-new-tokens", "4"])
    lm_report.main([str(out / f"bench-{lm}.json"), "--out", str(out)])
    return lm, out, json.loads((out / f"bench-{lm}.json").read_text())


def test_every_lm_record(lm_run):
    fw, _, data = lm_run
    recs = data["records"]
    keys = {(r["workload"], r["subject"].startswith("impl_"), r["dtype"], r["dims"]["B"]) for r in recs}
    assert keys == {(w, ours, d, B) for w in lm_report.WORKLOADS for ours in (True, False)
                    for d in ("bfloat16", "float32") for B in (2,)}, keys
    assert len(recs) == len(keys)
    for r in recs:
        assert r["timing"]["median_s"] > 0 and len(r["times_s"]) == r["timing"]["repeats"] >= 1, r
    decode = [r for r in recs if r["workload"] == "lm_decode"]
    assert all(r["dims"]["capacity"] == 13 and len(r["short_step_s"]) == len(r["times_s"]) for r in decode)
    assert all(r["flops"] > 0 for r in recs if r["workload"] != "lm_generate")


def test_lm_report(lm_run):
    fw, out, _ = lm_run
    md = (out / "lm.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith(f"| {fw} |")]
    assert len(rows) == 2 + 4, md       # two (B, dtype) targets rows, four (B, dtype, model) figures rows
    assert "≤ 1.10" in md and any(outcome in md for outcome in ("✓", "✗", "undecided")), md
    assert (out / "bench-lm.png").stat().st_size > 0


def test_generations_are_greedy_and_full_length(lm):
    """Ours and the peer each generate exactly the tokens asked for (the bench's weights never pick EOS; the
    peers are told not to stop), the same on a second call."""
    fw = importlib.import_module(f"bench.lm_{lm}")
    config = lm_config("lm_tiny", "float32")
    prompt = prompts(config, 2, 6)
    for subject in (fw.ours(config, bench_params(config), "cpu"), fw.peer(config, "cpu")):
        tokens = np.asarray(subject.generate(prompt, 5))
        assert tokens.shape == (2, 5), (subject.name, tokens)
        np.testing.assert_array_equal(tokens, subject.generate(prompt, 5))
        assert len(subject.decode_steps(prompt, 3, 9)) == 3
