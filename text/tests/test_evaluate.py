"""BLEU, the copy and translation-memory baselines, the near-duplicate rate, and checkpoint averaging."""

from __future__ import annotations

import numpy as np
import pytest

import spec
from spec import weights_io
from text import evaluate, train


def test_bleu_is_sacrebleus_with_its_signature():
    refs = ["Die Datei konnte nicht geöffnet werden.", "Speicher voll"]
    assert evaluate.bleu(refs, refs).bleu == 100.0
    score = evaluate.bleu(["Die Datei wurde nicht gefunden.", "Speicher voll"], refs)
    assert 0 < score.bleu < 100 and "tok:13a" in score.signature and "version:" in score.signature
    with pytest.raises(ValueError, match="2 hypotheses for 1 references"):
        evaluate.bleu(refs, refs[:1])


def test_translation_memory_returns_the_target_of_the_most_similar_training_source():
    train_src = ["could not open file", "disk full", "could not remove directory"]
    train_tgt = ["Datei nicht geöffnet", "Platte voll", "Ordner nicht entfernt"]
    assert evaluate.translation_memory(train_src, train_tgt, ["could not open files", "the disk is full"]) == [
        "Datei nicht geöffnet", "Platte voll"]
    assert evaluate.near_duplicate_rate(train_src, ["could not open files", "something else entirely"]) == 0.5
    assert evaluate.copy_source(["a", "b"]) == ["a", "b"]


def test_averaging_is_the_mean_of_the_parameters(tmp_path):
    c = spec.preset("tiny", param_dtype="float32")
    paths, params = [], [spec.init_params(c, seed) for seed in range(3)]
    for i, p in enumerate(params):
        paths.append(tmp_path / f"{i}.safetensors")
        weights_io.save_weights(paths[-1], c, p)
    config, mean = train.average_checkpoints(paths)
    assert config == c
    for name, value in mean.items():
        want = np.mean([p[name].astype(np.float64) for p in params], axis=0).astype(np.float32)
        np.testing.assert_array_equal(value, want)
    bf16 = c.replace(param_dtype="bfloat16")
    weights_io.save_weights(tmp_path / "bf16.safetensors", bf16, spec.init_params(bf16, 0))
    with pytest.raises(ValueError, match="another config"):
        train.average_checkpoints([paths[0], tmp_path / "bf16.safetensors"])
    with pytest.raises(ValueError, match="no checkpoint given"):
        train.average_checkpoints([])
