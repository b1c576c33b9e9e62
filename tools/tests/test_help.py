"""Every tool's --help gives the defaults a user would otherwise read the source for."""

from __future__ import annotations

import pytest

from tools import conformance, onnx_torch, train_demo, translate_demo


@pytest.mark.parametrize(("main", "expected"), [
    (train_demo.main, ["--steps STEPS         training steps (default: 1500)", "(default: 64)"]),
    (translate_demo.main, ["(default: 30.0)", "(default: torch,jax,tf,peer)", "(default: 200)"]),
    (conformance.main, ["(default: "]),
    (onnx_torch.main, ["usage: python -m tools.onnx_torch [-h] weights out", "encoder.onnx and decoder.onnx"]),
])
def test_help_shows_defaults(main, expected, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # no line breaks inside the texts looked for
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for text in expected:
        assert text in out, (text, out)
    assert "(default: None)" not in out and "(default: False)" not in out
