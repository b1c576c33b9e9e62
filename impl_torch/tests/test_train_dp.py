"""Data-parallel training on DDP (``impl_torch.train_dp``): two workers against one, resume, a killed
worker. One worker runs in this process through ``main``; two run as ``python -m impl_torch.train_dp``, which
launches them under torchrun (about 3.5 s a launch on 2 CPU cores, most of it starting three Pythons)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import torch.distributed as dist

from impl_torch import train_dp
from spec import data_parallel, data_parallel_cli, demo, training

EPS32 = float(np.finfo(np.float32).eps)
EQUALITY = ["--config", "tiny", "--dtype", "float32", "--dropout", "0", "--steps", "3", "--batch", "8",
            "--record-steps", "1,3"]
# Dropout at tiny's default 0.1, so a resume must restore both workers' generators.
RESUMABLE = ["--data-parallel", "2", "--config", "tiny", "--batch", "8", "--checkpoint-every", "2",
             "--record-steps", "4"]
TIMEOUT_S = 300


def launch(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``python -m impl_torch.train_dp *args`` in a process of its own (torchrun's launcher for N > 1)."""
    done = subprocess.run([sys.executable, "-m", "impl_torch.train_dp", *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if check and done.returncode:
        pytest.fail(f"train_dp {' '.join(args)} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done


def recorded(folder: Path) -> dict:
    """A ``--record`` folder: {"loss": [...], "<grad|params>_<k>": {name: float32 array}}."""
    out = {"loss": json.loads((folder / "losses.json").read_text())["losses"]}
    for f in folder.glob("*.safetensors"):
        out[f.stem] = safetensors.numpy.load_file(str(f))
    return out


def test_two_workers_compute_what_one_device_computes(tmp_path):
    """Measured (this CPU, torch 2.13, steps 1 and 3): losses 1 ulp apart at most (4.8e-7 of 4.6); the worst
    gradient tensor 7.2 eps of its largest element (decoder.layers.1.self_attn.w_k, step 3); the weights at most
    2.8e-5 (step 3) and 8.4e-5 (step 1) of the summed learning rate (Adam moves a weight by about lr a step): fp32
    rounding of sums taken in another order (each worker's products over half the rows, then one sum of two; DDP's
    average is exactly fl(g_0 + g_1), checked separately). Bounds: 4 eps of the loss, 16 eps of each gradient
    tensor's largest element, 2.5e-4 of the summed learning rate (a mean of per-worker means is off by ~1e-2)."""
    c = data_parallel_cli.config_of("tiny", "float32", 0.0)
    for step in (1, 2, 3):  # uneven token counts, or a mean of per-worker means would pass too
        batch = data_parallel.global_batch(c, step, 8, 0)
        assert len({data_parallel.token_count(data_parallel.shard(batch, r, 2)[2], c.pad_id) for r in (0, 1)}) == 2
    one, two = tmp_path / "one", tmp_path / "two"
    result = train_dp.main(["--data-parallel", "1", *EQUALITY, "--record", str(one)])  # in this process
    assert len(result["losses"]) == 3 and not dist.is_initialized()
    launch("--data-parallel", "2", *EQUALITY, "--record", str(two))
    got, want = recorded(two), recorded(one)
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=4 * EPS32, atol=0)
    for k in (1, 3):
        for name, g in got[f"grad_{k}"].items():
            ref = want[f"grad_{k}"][name]
            assert np.abs(g - ref).max() <= 16 * EPS32 * np.abs(ref).max(), (k, name)
        lr_total = sum(training.learning_rate(t, c.d_model, demo.TRAIN_CONFIG.warmup_steps) for t in range(1, k + 1))
        for name, p in got[f"params_{k}"].items():
            assert np.abs(p - want[f"params_{k}"][name]).max() <= 2.5e-4 * lr_total, (k, name)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """Two workers, dropout on, steps 1-4 with checkpoints at 2 and 4, never stopped: ``recorded``."""
    root = tmp_path_factory.mktemp("whole")
    launch(*RESUMABLE, "--steps", "4", "--checkpoint-dir", str(root / "ckpt"), "--record", str(root / "rec"))
    assert sorted(p.name for p in (root / "ckpt").iterdir()) == ["step-00000002", "step-00000004"]
    assert sorted(p.name for p in (root / "ckpt" / "step-00000004").iterdir()) == [
        "model.safetensors", "progress.json", "rng-1.npy", "train_state.safetensors"]
    return recorded(root / "rec")


def assert_bit_identical(got: dict, want: dict) -> None:
    assert got["loss"] == want["loss"][2:]  # steps 3 and 4
    for name, w in want["params_4"].items():
        np.testing.assert_array_equal(got["params_4"][name], w, err_msg=name)


def test_resumed_run_is_bit_identical(tmp_path, uninterrupted):
    launch(*RESUMABLE, "--steps", "2", "--checkpoint-dir", str(tmp_path / "ckpt"))
    done = launch(*RESUMABLE, "--steps", "4", "--checkpoint-dir", str(tmp_path / "ckpt"), "--resume",
                  "--record", str(tmp_path / "rec"))
    assert "resumed from step 2" in done.stdout
    assert_bit_identical(recorded(tmp_path / "rec"), uninterrupted)


def test_killed_worker_fails_the_run_and_its_checkpoint_resumes(tmp_path, uninterrupted):
    ckpt = tmp_path / "ckpt"
    killed = launch(*RESUMABLE, "--steps", "4", "--checkpoint-dir", str(ckpt), "--kill-at", "3:1", check=False)
    assert killed.returncode != 0
    assert "ChildFailedError" in killed.stderr, killed.stderr[-2000:]  # torchrun's report, naming rank and signal
    assert "rank      : 1" in killed.stderr and "SIGKILL" in killed.stderr, killed.stderr[-2000:]
    assert data_parallel.latest_checkpoint(ckpt).name == "step-00000002"
    launch(*RESUMABLE, "--steps", "4", "--checkpoint-dir", str(ckpt), "--resume", "--record", str(tmp_path / "rec"))
    assert_bit_identical(recorded(tmp_path / "rec"), uninterrupted)


def test_world_size_must_match_data_parallel(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(SystemExit, match="--data-parallel 2, but torchrun started 3 processes"):
        train_dp.main(["--data-parallel", "2", "--config", "tiny", "--steps", "1"])
    assert not dist.is_initialized()


def test_engine_needs_a_process_group():
    with pytest.raises(ValueError, match="process group"):
        train_dp.DataParallel(data_parallel_cli.options(["--config", "tiny"], "test"))

