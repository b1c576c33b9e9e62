"""Files the spec writes: the same bytes from every process, and created with the user's umask."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

import spec
from spec import train_state_io, weights_io
from spec.training import TrainConfig

WRITE = """
import sys
import numpy as np
import spec
from spec import train_state_io, weights_io
from spec.training import TrainConfig
c = spec.preset("tiny")
params = spec.init_params(c, 0)
weights_io.save_weights(sys.argv[1] + "/model.safetensors", c, params)
zeros = {k: np.zeros(v.shape, np.float32) for k, v in params.items()}
train_state_io.save(sys.argv[1] + "/state.safetensors", train_state_io.StoredState(
    zeros, zeros, 3, TrainConfig(), np.arange(4, dtype=np.uint32), "torch"))
"""


def test_the_same_state_gives_the_same_bytes_in_every_process(tmp_path):
    folders = [tmp_path / str(i) for i in range(6)]
    for f in folders:  # separate processes: safetensors' metadata order varies between them, not within one
        f.mkdir()
        subprocess.run([sys.executable, "-c", WRITE, str(f)], check=True)
    for name in ("model.safetensors", "state.safetensors"):
        blobs = {(f / name).read_bytes() for f in folders}
        assert len(blobs) == 1, name


def test_files_are_created_with_the_users_umask(tmp_path):
    c = spec.preset("tiny")
    params = spec.init_params(c, 0)
    old = os.umask(0o022)
    try:
        weights_io.save_weights(tmp_path / "model.safetensors", c, params)
        zeros = {k: np.zeros(v.shape, np.float32) for k, v in params.items()}
        train_state_io.save(tmp_path / "state.safetensors", train_state_io.StoredState(
            zeros, zeros, 0, TrainConfig(), np.zeros(2, np.uint32), "jax"))
    finally:
        os.umask(old)
    for name in ("model.safetensors", "state.safetensors"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o644, name
    assert weights_io.read_config(tmp_path / "model.safetensors") == c


def test_the_header_does_not_depend_on_safetensors_metadata_order(tmp_path, monkeypatch):
    import json

    import safetensors.numpy

    tensors, meta = {"a": np.zeros(3, np.float32)}, {"step": "1", "train_config": "{}", "framework": "jax"}
    weights_io.write_safetensors(tmp_path / "plain.safetensors", tensors, meta)
    save = safetensors.numpy.save

    def reversed_metadata(t, metadata=None):  # as another process's hash order might write it
        blob = save(t, metadata=metadata)
        n = int.from_bytes(blob[:8], "little")
        header = json.loads(blob[8:8 + n])
        header["__metadata__"] = dict(reversed(list(header["__metadata__"].items())))
        return blob[:8] + json.dumps(header, separators=(",", ":")).encode().ljust(n) + blob[8 + n:]

    monkeypatch.setattr(safetensors.numpy, "save", reversed_metadata)
    weights_io.write_safetensors(tmp_path / "reversed.safetensors", tensors, meta)
    assert (tmp_path / "plain.safetensors").read_bytes() == (tmp_path / "reversed.safetensors").read_bytes()
