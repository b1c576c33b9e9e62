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


@pytest.mark.parametrize("command, expected", [
    ("prepare", ["(default: 8000)", "(default: 0.02)"]),
    ("train", ["(default: mini)", "(default: 2048)", "(default: 400)", "(default: 0)", "(default: retain)"]),
    ("evaluate", ["(default: torch)", "(default: 1)", "(default: test)"]),
])
def test_help_gives_the_defaults(command, expected, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # no line breaks inside the texts looked for
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and all(text in out for text in expected), out
    assert "(default: None)" not in out and "(default: False)" not in out
