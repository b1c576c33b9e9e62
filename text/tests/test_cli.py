"""The command line (``python -m text``): bad input ends with one line naming the file, before any work."""

from __future__ import annotations

import pytest

import spec
from text import cli


@pytest.mark.parametrize("files, message", [
    ({"a.en": "one\ntwo\n", "a.de": "eins\n"}, "a.en has 2 lines and .*a.de has 1"),
    ({"a.en": "", "a.de": ""}, "a.en: empty corpus"),
    ({"a.en": "one\n", "a.de": b"\xe4\n"}, "a.de:1: not UTF-8"),
])
def test_prepare_refuses_bad_corpora(tmp_path, files, message):
    for name, text in files.items():
        (tmp_path / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(SystemExit, match=message):
        cli.main(["prepare", "--source", str(tmp_path / "a.en"), "--target", str(tmp_path / "a.de"),
                  "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_of_another_vocabulary_is_refused(tmp_path):
    from text.tokenizer import Tokenizer

    sentences = [f"sentence number {i} with words like Datei and öffnen" for i in range(300)]
    Tokenizer.train(sentences, tmp_path / "t.model", 400)
    spec.weights_io.save_weights(tmp_path / "w.safetensors", spec.preset("tiny"), spec.init_params(
        spec.preset("tiny"), 0))
    with pytest.raises(SystemExit, match="t.model has 400 pieces, the model's config expects vocab_size 61"):
        cli.main(["translate", "--backend", "torch", "--weights", str(tmp_path / "w.safetensors"), "--tokenizer",
                  str(tmp_path / "t.model")])
