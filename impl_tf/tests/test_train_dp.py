"""Data-parallel training on ``tf.distribute`` (``impl_tf.train_dp``, issue 13): two replicas against one, the
engine's mirrored state and per-replica dropout streams, resume, a killed run.

One replica runs in this process (its TensorFlow runtime has one CPU device, fixed once started); two run as
``python -m impl_tf.train_dp``, whose ``main`` splits the CPU into two logical devices before TensorFlow starts. The
launches share a persistent XLA cache (``--tf_xla_persistent_cache_directory``): a launch spends most of its time
tracing and compiling the step (XLA compiles it once per device), and one that finds the programs in the cache
skips the compiling. The cache holds the programs XLA compiled, so what they compute is unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import tensorflow as tf

from impl_tf import train_dp
from spec import data_parallel, data_parallel_cli, demo, training

EPS32 = float(np.finfo(np.float32).eps)
EQUALITY = ["--config", "tiny", "--dtype", "float32", "--dropout", "0", "--steps", "3", "--batch", "8",
            "--record-steps", "1,3"]
# Dropout at tiny's default 0.1, so a resume must restore the dropout generator. A batch of 32 puts steps 1-4 in
# one length bucket (with 8, step 4 is the first of 16 tokens): each launch compiles one program per device.
RESUMABLE = ["--data-parallel", "2", "--config", "tiny", "--batch", "32", "--checkpoint-every", "2",
             "--record-steps", "4"]
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    """``launch(*args, check=True)``: ``python -m impl_tf.train_dp *args`` in a process of its own, on the CPU,
    its output captured; ``launch.code(text)``: ``python -c text`` the same way. All share an XLA cache."""
    cache = tmp_path_factory.mktemp("xla_cache")
    env = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="1",
               TF_XLA_FLAGS=f"{os.environ.get('TF_XLA_FLAGS', '')} --tf_xla_persistent_cache_directory={cache}")
    env.pop("TF_CONFIG", None)

    def run(command: list[str], check: bool) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
        if check and done.returncode:
            pytest.fail(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-4000:]}")
        return done

    def launch(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run(["-m", "impl_tf.train_dp", *args], check)

    launch.code = lambda text: run(["-c", textwrap.dedent(text)], True)
    return launch


def recorded(folder: Path) -> dict:
    """A ``--record`` folder: {"loss": [...], "<grad|params>_<k>": {name: float32 array}}."""
    out = {"loss": json.loads((folder / "losses.json").read_text())["losses"]}
    for f in folder.glob("*.safetensors"):
        out[f.stem] = safetensors.numpy.load_file(str(f))
    return out


def _global_state() -> tuple:
    from tensorflow.python.framework.config import is_op_determinism_enabled  # no public getter

    return (tf.config.experimental.tensor_float_32_execution_enabled(), is_op_determinism_enabled(),
            tf.config.get_soft_device_placement(), tf.config.functions_run_eagerly(),
            tf.random.get_global_generator().state.numpy().tobytes(), str(np.random.get_state()))


def test_two_replicas_compute_what_one_computes(tmp_path, launch):
    """Measured (this CPU, TF 2.21, steps 1 and 3): losses 0.9 eps apart at most (one fp32 ulp of 4.5); the worst
    gradient tensor 8.1 eps of its largest element (decoder.layers.1.self_attn.w_q, step 1); the weights at most
    5.3e-5 (step 1) and 6.8e-5 (step 3) of the summed learning rate (Adam moves a weight by about lr a step): fp32
    rounding of sums taken in another order (each replica's rows, then the all-reduce of two partial sums). Bounds,
    as impl_jax's and impl_torch's: 2 eps of the loss, 16 eps of each gradient tensor's largest element, 2.5e-4 of
    the summed learning rate (a mean of per-worker means is off by ~1e-2). One replica runs here, through the
    library's class, which must leave TensorFlow's and NumPy's global state as it found it."""
    c = data_parallel_cli.config_of("tiny", "float32", 0.0)
    for step in (1, 2, 3):  # uneven token counts, or a mean of per-worker means would pass too
        batch = data_parallel.global_batch(c, step, 8, 0)
        assert len({data_parallel.token_count(data_parallel.shard(batch, r, 2)[2], c.pad_id) for r in (0, 1)}) == 2
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    o = data_parallel_cli.options(["--data-parallel", "1", *EQUALITY, "--record", str(one)], "test")
    before = _global_state()
    result = data_parallel.run(train_dp.DataParallel(o), o, "tf")
    assert _global_state() == before
    assert len(result["losses"]) == 3
    launch("--data-parallel", "2", *EQUALITY, "--record", str(two))
    got, want = recorded(two), recorded(one)
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=2 * EPS32, atol=0)
    for k in (1, 3):
        for name, g in got[f"grad_{k}"].items():
            ref = want[f"grad_{k}"][name]
            assert np.abs(g - ref).max() <= 16 * EPS32 * np.abs(ref).max(), (k, name)
        lr_total = sum(training.learning_rate(t, c.d_model, demo.TRAIN_CONFIG.warmup_steps) for t in range(1, k + 1))
        for name, p in got[f"params_{k}"].items():
            assert np.abs(p - want[f"params_{k}"][name]).max() <= 2.5e-4 * lr_total, (k, name)


def test_state_is_mirrored_and_each_replica_draws_its_own_masks(launch):
    """Every variable (weights, moments, step, the generator's state) has a copy on each of the two devices; drawn
    in replica context, the one generator gives each replica another seed while its copies advance alike (so the
    train state's one "rng" restores both streams); a batch two replicas cannot split is refused."""
    done = launch.code("""
        import json
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        from impl_tf import train_dp
        from spec import data_parallel as dp, data_parallel_cli as cli
        o = cli.options(["--data-parallel", "2", "--config", "tiny", "--batch", "8"], "test")
        engine = train_dp.DataParallel(o)
        s, state = engine.strategy, engine.state
        local = lambda x: [v.numpy().tolist() for v in s.experimental_local_results(x)]
        seeds = local(tf.function(lambda: s.run(lambda: state.rng.make_seeds(1)[:, 0]))())
        variables = [*engine.model.params.values(), *state.m.values(), *state.v.values(), state.step,
                     state.rng.state]
        try:
            engine.step(dp.global_batch(o.config, 1, 7, 0), keep_gradient=False)
            refused = ""
        except ValueError as e:
            refused = str(e)
        print(json.dumps({"copies": sorted({len(s.experimental_local_results(v)) for v in variables}),
                          "seeds": seeds, "states": local(state.rng.state), "refused": refused}))
    """)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["copies"] == [2]
    assert out["seeds"][0] != out["seeds"][1]
    assert out["states"][0] == out["states"][1] != [0, 0, 0]
    assert "multiple of the number of workers" in out["refused"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, launch) -> dict:
    """Two replicas, dropout on, steps 1-4 with checkpoints at 2 and 4, never stopped: ``recorded``."""
    root = tmp_path_factory.mktemp("whole")
    launch(*RESUMABLE, "--steps", "4", "--checkpoint-dir", str(root / "ckpt"), "--record", str(root / "rec"))
    assert sorted(p.name for p in (root / "ckpt").iterdir()) == ["step-00000002", "step-00000004"]
    assert sorted(p.name for p in (root / "ckpt" / "step-00000004").iterdir()) == [
        "model.safetensors", "progress.json", "train_state.safetensors"]  # the one generator state is in the state
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
    tf.constant(0.0)  # this process's runtime has started: its devices are fixed
    if len(tf.config.list_logical_devices("CPU")) >= 2 or tf.config.list_physical_devices("GPU"):
        pytest.skip("this process already has two devices")
    with pytest.raises(SystemExit, match="already started in this process with 1 CPU device"):
        train_dp.main(["--data-parallel", "2", "--config", "tiny", "--steps", "1", "--batch", "2"])
    with pytest.raises(ValueError, match="--data-parallel 2 needs as many devices; TensorFlow has 1"):
        train_dp.DataParallel(data_parallel_cli.options(["--data-parallel", "2", "--config", "tiny"], "test"))


def test_kill_at_names_a_process():
    with pytest.raises(SystemExit, match="the rank is a process, and this run has one"):
        train_dp.main(["--config", "tiny", "--steps", "1", "--kill-at", "1:1"])
