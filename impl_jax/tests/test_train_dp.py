"""Data-parallel training on ``jax.sharding`` (``impl_jax.train_dp``, issue 13): two devices against one, the
all-reduce in the compiled step, resume, a killed run.

One device runs in this process through ``main``; two run as ``python -m impl_jax.train_dp``, whose ``main`` gives
JAX's CPU backend two devices before it starts (this process's backend is fixed once started). The launches share
a JAX compilation cache (``JAX_COMPILATION_CACHE_DIR``): compiling the tiny training step takes 3-5 s on two cores,
a launch that finds its programs in the cache about 2 s. The cache holds the programs XLA compiled, so what they
compute is unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
import safetensors.numpy

from impl_jax import train_dp
from spec import data_parallel, data_parallel_cli, demo, schema, training

EPS32 = float(np.finfo(np.float32).eps)
EQUALITY = ["--config", "tiny", "--dtype", "float32", "--dropout", "0", "--steps", "3", "--batch", "8",
            "--record-steps", "1,3"]
# Dropout at tiny's default 0.1, so a resume must restore the dropout key.
RESUMABLE = ["--data-parallel", "2", "--config", "tiny", "--batch", "8", "--checkpoint-every", "2",
             "--record-steps", "4"]
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    """``launch(*args, check=True)``: ``python -m impl_jax.train_dp *args`` in a process of its own, on the CPU,
    its output captured; ``launch.code(text)``: ``python -c text`` the same way. Both share a compilation cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env.update(PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu", JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_COMPILATION_CACHE_DIR=str(tmp_path_factory.mktemp("jax_cache")))

    def run(command: list[str], check: bool) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
        if check and done.returncode:
            pytest.fail(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-4000:]}")
        return done

    def launch(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run(["-m", "impl_jax.train_dp", *args], check)

    launch.code = lambda text: run(["-c", textwrap.dedent(text)], True)
    return launch


def recorded(folder: Path) -> dict:
    """A ``--record`` folder: {"loss": [...], "<grad|params>_<k>": {name: float32 array}}."""
    out = {"loss": json.loads((folder / "losses.json").read_text())["losses"]}
    for f in folder.glob("*.safetensors"):
        out[f.stem] = safetensors.numpy.load_file(str(f))
    return out


def test_two_devices_compute_what_one_device_computes(tmp_path, launch):
    """Measured (this CPU, jax 0.10.2, steps 1 and 3): losses 0.9 eps apart at most (4.8e-7 of 4.6); the worst
    gradient tensor 5.1 eps of its largest element (decoder.layers.1.self_attn.w_k, step 3); the weights at most
    8.4e-5 (step 1) and 1.1e-4 (step 3) of the summed learning rate (Adam moves a weight by about lr a step): fp32
    rounding of sums taken in another order (each device's rows, then the all-reduce of two partial sums). Bounds,
    as impl_torch's: 4 eps of the loss, 16 eps of each gradient tensor's largest element, 2.5e-4 of the summed
    learning rate (a mean of per-worker means is off by ~1e-2)."""
    c = data_parallel_cli.config_of("tiny", "float32", 0.0)
    for step in (1, 2, 3):  # uneven token counts, or a mean of per-worker means would pass too
        batch = data_parallel.global_batch(c, step, 8, 0)
        assert len({data_parallel.token_count(data_parallel.shard(batch, r, 2)[2], c.pad_id) for r in (0, 1)}) == 2
    one, two = tmp_path / "one", tmp_path / "two"
    result = train_dp.main(["--data-parallel", "1", *EQUALITY, "--record", str(one)])  # in this process
    assert len(result["losses"]) == 3
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


def test_compiled_step_all_reduces_the_gradients(launch):
    """XLA, not this code, exchanges the gradients: the step's program for two devices holds an all-reduce (of
    the loss's two sums and of every gradient); everything the step returns stays replicated; a batch that two
    devices cannot split is refused."""
    done = launch.code("""
        import json
        import jax
        jax.config.update("jax_num_cpu_devices", 2)
        from impl_jax import train_dp
        from spec import data_parallel as dp, data_parallel_cli as cli
        o = cli.options(["--data-parallel", "2", "--config", "tiny", "--batch", "8"], "test")
        engine = train_dp.DataParallel(o)
        batch = dp.global_batch(o.config, 1, 8, 0)
        shards = engine._shards(batch)  # the program step runs, as XLA compiles it for the mesh (SPMD-partitioned)
        text = train_dp._step.lower(engine.model, engine.state, *shards, keep_gradient=False).compile().as_text()
        engine.step(batch, keep_gradient=False)
        leaves = jax.tree.leaves((engine.model, engine.state))
        try:
            engine.step(dp.global_batch(o.config, 1, 7, 0), keep_gradient=False)
            refused = ""
        except ValueError as e:
            refused = str(e)
        print(json.dumps({"all_reduces": [line.split(" = ")[1].split(")")[0] for line in text.splitlines()
                                          if " all-reduce(" in line],
                          "devices": sorted({len(x.sharding.device_set) for x in leaves}),
                          "replicated": all(x.sharding.is_fully_replicated for x in leaves), "refused": refused}))
    """)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["all_reduces"], "no all-reduce in the compiled step: the devices would not share gradients"
    n_params = len(schema.param_specs(data_parallel_cli.config_of("tiny", "bfloat16", None)))
    assert sum(r.count("f32[") for r in out["all_reduces"]) >= n_params, out["all_reduces"]
    assert out["devices"] == [2] and out["replicated"]
    assert "multiple of the number of workers" in out["refused"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, launch) -> dict:
    """Two devices, dropout on, steps 1-4 with checkpoints at 2 and 4, never stopped: ``recorded``."""
    root = tmp_path_factory.mktemp("whole")
    launch(*RESUMABLE, "--steps", "4", "--checkpoint-dir", str(root / "ckpt"), "--record", str(root / "rec"))
    assert sorted(p.name for p in (root / "ckpt").iterdir()) == ["step-00000002", "step-00000004"]
    assert sorted(p.name for p in (root / "ckpt" / "step-00000004").iterdir()) == [
        "model.safetensors", "progress.json", "train_state.safetensors"]  # the one dropout key is in the state
    return recorded(root / "rec")


def assert_bit_identical(got: dict, want: dict) -> None:
    assert got["loss"] == want["loss"][2:]  # steps 3 and 4
    for name, w in want["params_4"].items():
        np.testing.assert_array_equal(got["params_4"][name], w, err_msg=name)


def test_resumed_run_is_bit_identical(tmp_path, launch, uninterrupted):
    launch(*RESUMABLE, "--steps", "2", "--checkpoint-dir", str(tmp_path / "ckpt"))
    done = launch(*RESUMABLE, "--steps", "4", "--checkpoint-dir", str(tmp_path / "ckpt"), "--resume",
                  "--record", str(tmp_path / "rec"))
    assert "resumed from step 2" in done.stdout
    assert_bit_identical(recorded(tmp_path / "rec"), uninterrupted)


def test_killed_run_fails_and_its_checkpoint_resumes(tmp_path, launch, uninterrupted):
    """One process drives both devices, so rank 0 is the process: SIGKILLed, it exits -9 with no report."""
    ckpt = tmp_path / "ckpt"
    killed = launch(*RESUMABLE, "--steps", "4", "--checkpoint-dir", str(ckpt), "--kill-at", "3:0", check=False)
    assert killed.returncode == -9, (killed.returncode, killed.stderr[-2000:])
    assert data_parallel.latest_checkpoint(ckpt).name == "step-00000002"
    launch(*RESUMABLE, "--steps", "4", "--checkpoint-dir", str(ckpt), "--resume", "--record", str(tmp_path / "rec"))
    assert_bit_identical(recorded(tmp_path / "rec"), uninterrupted)


def test_main_refuses_devices_it_can_no_longer_add():
    jax.devices()  # this process's backend has started: its device count is fixed
    if jax.device_count() >= 2:
        pytest.skip("this process already has two devices")
    with pytest.raises(SystemExit, match="already started in this process with 1 device"):
        train_dp.main(["--data-parallel", "2", "--config", "tiny", "--steps", "1", "--batch", "2"])
    with pytest.raises(ValueError, match="--data-parallel 2 needs as many devices; JAX has 1"):
        train_dp.DataParallel(data_parallel_cli.options(["--data-parallel", "2", "--config", "tiny"], "test"))


def test_kill_at_names_a_process():
    with pytest.raises(SystemExit, match="the rank is a process, and this run has 1"):
        train_dp.main(["--config", "tiny", "--steps", "1", "--kill-at", "1:1"])
