"""The whole text cycle on a small budget, in every backend: corpus -> tokenizer -> training -> translation ->
BLEU. A small model trains through impl_torch's common API for 400 steps on English -> German from the
system's gettext catalogs; the loss must fall and dev BLEU rise over the run; then one checkpoint is translated
by all three backends, which must give the reference's exact tokens on every decisive sentence."""

from __future__ import annotations

import dataclasses
import importlib
import json

import numpy as np
import pytest

import spec
from text import agreement, catalogs, data, evaluate, train
from text.tokenizer import Tokenizer
from text.translate import search_ids, translate

CONFIG = spec.preset("tiny", vocab_size=1000, d_model=64, n_heads=4, d_k=16, d_v=16, d_ff=256, max_len=128,
                     param_dtype="float32")
OPTIONS = train.Options(minutes=None, max_steps=400, tokens_per_batch=1024, warmup_steps=100, lr_scale=0.15,
                        checkpoint_steps=100, average=3, dev_sentences=200)
AGREEMENT_SENTENCES = 100


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The catalogs' En->De pairs, cleaned and split, with a 1000-piece tokenizer."""
    return data.prepare(catalogs.read_catalogs("de"), tmp_path_factory.mktemp("data"), CONFIG.vocab_size)


@pytest.fixture(scope="module")
def run(prepared, tmp_path_factory):
    """400 steps of training in impl_torch (one thread, as the demo's), a checkpoint every 100."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = tmp_path_factory.mktemp("run")
        progress = train.Run(importlib.import_module("impl_torch"), prepared, out, CONFIG, OPTIONS).train(
            progress_bar=False, log=lambda r: None)
    finally:
        torch.set_num_threads(threads)
    return out, progress, [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]


def test_the_corpus_is_cleaned_split_and_measured(prepared):
    stats = prepared.stats
    assert stats["cleaning"]["kept"] == sum(stats["split"].values()) > 10_000
    for side in ("dev", "test"):
        base = stats["baselines"][side]
        assert 0 < base["copy_bleu"] < base["memory_bleu"] < 100
        assert base["near_duplicate_rate_90"] < 0.1       # a split by source hash alone leaks ~18% here
    tokenizer = Tokenizer.load(prepared.tokenizer_path, CONFIG)
    assert tokenizer.round_trip_failures(prepared.test.sources + prepared.test.targets) == []


def test_the_loss_falls_and_dev_bleu_rises(run):
    _, progress, log = run
    assert [r["step"] for r in log] == [100, 200, 300, 400] and progress["step"] == 400
    assert log[-1]["train_loss"] < log[0]["train_loss"] - 1.0, [r["train_loss"] for r in log]
    assert log[-1]["dev_loss"] < log[0]["dev_loss"], [r["dev_loss"] for r in log]
    assert log[-1]["dev_bleu_greedy"] > log[0]["dev_bleu_greedy"] + 1.0, [r["dev_bleu_greedy"] for r in log]
    assert 1 <= log[0]["shapes"] <= log[-1]["shapes"] == len(progress["shapes"]) and 0 < log[-1]["padding"] < 0.5


def test_a_resumed_run_continues_from_its_checkpoint(run, prepared):
    out, progress, log = run
    T = importlib.import_module("impl_torch")
    with pytest.raises(ValueError, match="written with other lr_scale"):
        train.Run(T, prepared, out, CONFIG, dataclasses.replace(OPTIONS, lr_scale=0.3)).start()
    with pytest.raises(ValueError, match="written with other fill_last"):      # other batches from that step on
        train.Run(T, prepared, out, CONFIG, dataclasses.replace(OPTIONS, fill_last=False)).start()
    longer = train.Run(T, prepared, out, CONFIG, dataclasses.replace(OPTIONS, max_steps=500))
    model, state, p = longer.start()
    assert p["step"] == progress["step"] == 400 and p["checkpoints"][-1] == log[-1]["checkpoint"]
    np.testing.assert_array_equal(longer.batches.batch(400).src, train.Run(
        T, prepared, out, CONFIG, OPTIONS).batches.batch(400).src)      # the batch an uninterrupted run takes next


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("backend", ["impl_torch", "impl_jax", "impl_tf"])
def test_every_backend_translates_the_checkpoint_as_the_reference_decides(run, prepared, backend, dtype):
    """Greedy token ids of the averaged checkpoint equal the reference's exact ones on every decisive sentence
    (``spec.decisions``); in fp32 compute nearly every sentence is decisive, in bf16 (the model's own) at least
    one must be, or the check judged nothing."""
    out, _, _ = run
    T = importlib.import_module(backend)
    stored, params = spec.weights_io.load_weights(out / "averaged.safetensors")
    config = stored.replace(dtype=dtype)
    model = T.load_weights(out / "averaged.safetensors", config)
    tokenizer = Tokenizer.load(out / "tokenizer.model", config)
    sentences = agreement.fitting(tokenizer, prepared.test.sources, CONFIG.max_len)[:AGREEMENT_SENTENCES]
    ref, _ = agreement.reference_translations(config, params, tokenizer, sentences)
    judged = agreement.judged(ref, {backend: search_ids(T, model, tokenizer, sentences, beam_size=1)})
    print(f"{backend} {dtype}: {judged['decisive']} of {len(sentences)} sentences decisive")
    assert judged["decisive"] >= (0.8 * len(sentences) if dtype == "float32" else 1), judged
    assert judged["decisive_differing"][backend] == [], judged
    if dtype == "bfloat16":
        targets = dict(zip(prepared.test.sources, prepared.test.targets, strict=True))
        score = evaluate.bleu(translate(T, model, tokenizer, sentences), [targets[s] for s in sentences])
        assert score.bleu > 0.0
