"""The language-model demo in seconds: the byte-level BPE's exact round trips, a 3-step run of a tiny model in each
importable backend writing a JSON, and the report reading those into a PNG and Markdown. ``python -m
tools.lm_demo --backend <fw>`` is the full run.
"""

from __future__ import annotations

import importlib
import json
from pydoc_data.topics import topics

import pytest

from spec.config import LM_TINY
from text.bpe import ByteLevelBPE
from tools import lm_demo
from tools.train_demo import BACKENDS

TINY = LM_TINY.replace(vocab_size=300, n_decoder_layers=1, max_len=32, dropout=0.0, param_dtype="float32")
UNSEEN = ["Schöne Grüße aus Köln: 3 × 7 = 21 ✓", "日本語のテキスト 😀", "  two  spaces\tand a tab\r\n", "\x00\x7f",
          "⟨pad⟩ ⟨bos⟩ ⟨eos⟩ <s> </s> <pad>: the reserved names as text", "", "a"]


@pytest.fixture(scope="module")
def bpe() -> ByteLevelBPE:
    train, _ = lm_demo.split_topics()
    return ByteLevelBPE.train((topics[k] for k in train[:20]), TINY.vocab_size, TINY)


def test_round_trip_is_exact_and_never_yields_a_reserved_id(bpe):
    _, held = lm_demo.split_topics()
    for text in UNSEEN + [topics[k] for k in held]:
        ids = bpe.encode(text)
        assert bpe.decode(ids) == text
        assert not {TINY.pad_id, TINY.bos_id, TINY.eos_id} & set(ids), text


def test_reserved_ids_are_the_configs_and_decode_stops_at_eos(bpe, tmp_path):
    assert (bpe.pad_id, bpe.bos_id, bpe.eos_id, bpe.vocab_size) == (0, 1, 2, TINY.vocab_size)
    ids = bpe.encode("stop here")
    assert bpe.decode([bpe.bos_id, *ids, bpe.eos_id, *bpe.encode("not this"), bpe.pad_id]) == "stop here"
    assert ByteLevelBPE.load(bpe.save(tmp_path / "bpe.json"), TINY).to_str() == bpe.to_str()
    with pytest.raises(ValueError, match="differ"):
        ByteLevelBPE.load(tmp_path / "bpe.json", TINY.replace(vocab_size=512))


def test_split_holds_out_whole_topics_of_a_tenth():
    train, held = lm_demo.split_topics()
    assert sorted(train + held) == sorted(topics) and train[-1] < held[0]
    share = sum(len(topics[k]) for k in held) / sum(map(len, topics.values()))
    assert 0.10 <= share < 0.10 + len(topics[held[0]]) / sum(map(len, topics.values()))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, object]:
    """A 3-step run per importable backend, validated on one batch of windows, written as JSON."""
    out, files = tmp_path_factory.mktemp("lm"), {}
    for backend in BACKENDS:
        try:
            T = importlib.import_module(f"impl_{backend}")
        except ImportError:
            continue
        if not hasattr(T, "LanguageModel"):
            continue  # an impl without the decoder-only model yet
        result = lm_demo.run(T, steps=3, batch=2, config=TINY, eval_every=2, new_tokens=4,
                             val_windows=lm_demo.VAL_BATCH, threads=1, show_progress=False)
        files[backend] = out / f"{backend}.json"
        files[backend].write_text(json.dumps(result))
    if not files:
        pytest.skip("no backend with a LanguageModel is importable")
    return files


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_three_steps_write_the_record(runs, backend):
    if backend not in runs:
        pytest.skip(f"impl_{backend} is not importable")
    r = json.loads(runs[backend].read_text())
    assert len(r["losses"]) == 3 and [e[0] for e in r["evals"]] == [0, 2, 3]
    assert {"greedy", "sampled"} <= set(r["samples"]) and r["threads"] == 1 and r["machine"]["cpu"]
    assert all(len(s["ids"]) <= 4 for s in r["samples"].values())


def test_report_writes_the_png_and_judges_agreement(runs, tmp_path):
    lm_report = pytest.importorskip("tools.lm_report", reason="the report needs matplotlib")
    # A run standing in for its own float32 twin: the agreement's code runs without a fourth training.
    one = next(iter(runs.values()))
    png, md = tmp_path / "lm.png", tmp_path / "lm.md"
    text = lm_report.main([*map(str, runs.values()), "--fp32", str(one), "--png", str(png), "--md", str(md)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert md.read_text() == text
    assert "Agreement:" in text and "Samples, greedy" in text
