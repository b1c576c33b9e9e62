"""The project's commands load a backend without the framework's native start-up log, and show it on failure."""

from __future__ import annotations

import subprocess
import sys

import pytest

from text import cli


def test_tensorflow_loads_without_its_start_up_log():
    done = subprocess.run([sys.executable, "-c", "from text import cli; cli.load_backend('tf', threads=1)"],
                          capture_output=True, text=True, check=True)
    assert done.stderr == ""


def test_a_failed_import_shows_what_it_wrote(tmp_path, monkeypatch, capfd):
    (tmp_path / "noisy_impl.py").write_text("import os\nos.write(2, b'native log\\n')\nraise ImportError('broken')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match="broken"):
        cli.load_backend("noisy_impl")
    assert "native log" in capfd.readouterr().err
