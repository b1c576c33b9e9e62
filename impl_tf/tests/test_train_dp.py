"""Data-parallel training on ``tf.distribute`` (``impl_tf.train_dp``), what is particular to TensorFlow: the
engine's mirrored state and per-replica dropout streams, the devices ``main`` can still add, ``--kill-at``. Two
replicas against one, resume and a killed run are the data-parallel conformance's (``nox -s train_dp``).

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

import pytest
import tensorflow as tf

from impl_tf import train_dp
from spec import data_parallel_cli

# Dropout at tiny's default 0.1, so a resume must restore the dropout generator. A batch of 32 puts steps 1-4 in
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
