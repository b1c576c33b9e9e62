"""Data-parallel training on ``jax.sharding`` (``impl_jax.train_dp``), what is particular to JAX: the all-reduce in
the compiled step, the devices ``main`` can still add, ``--kill-at``. Two devices against one, resume and a killed
run are the data-parallel conformance's (``nox -s train_dp``), for every backend.

One device runs in this process through ``main``; two run as ``python -m impl_jax.train_dp``, whose ``main`` gives
JAX's CPU backend two devices before it starts (this process's backend is fixed once started). The launches share
a JAX compilation cache (``JAX_COMPILATION_CACHE_DIR``), so a launch after the first loads the training step rather
than compiling it again. The cache holds the programs XLA compiled, so what they compute is unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import pytest

from impl_jax import train_dp
from spec import data_parallel_cli, schema

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
        lowered = train_dp.train_step_program.lower(engine.model, engine.state, *shards, keep_gradient=False)
        text = lowered.compile().as_text()
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
