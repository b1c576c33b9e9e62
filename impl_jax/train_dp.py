"""Data-parallel training on ``jax.sharding``: the command line of ``spec.data_parallel``.

    python -m impl_jax.train_dp --data-parallel 2 [--steps N] [--checkpoint-dir D [--resume]] [--record R]

Engine. One program over N devices under ``jax.jit``, driven by one process: a ``Mesh`` of the first N of
``jax.devices()`` with one axis "data"; the global batch is laid out by rows over it (``NamedSharding(mesh,
P("data"))``: device r holds worker r's ``spec.data_parallel.shard``, padded to the batch and length buckets), and
the weights, Adam's moments, the schedule's step and the dropout key are replicated (``NamedSharding(mesh, P())``).
The step is ``impl_jax.train``'s (``smoothed_loss`` of the model's forward with dropout, ``jax.value_and_grad``,
``adam_update``) as one jitted program (compiled with ``impl_jax.XLA_OPTIONS``) called on those arrays: it follows
the input shardings, and XLA's SPMD partitioner inserts the all-reduce of the gradients (and of the loss's two
sums); the compiled HLO holds it (tested). One process, so
``world`` is N, ``rank`` 0, ``chief`` True and ``barrier`` a no-op; ``--data-parallel 1`` is the same program on
a mesh of one device. On a CPU, ``main`` gives JAX's CPU backend N devices (``jax_num_cpu_devices``) before it
starts; on a GPU or TPU host the devices are the accelerator's. Several hosts (untested here): one process per
host, each with ``JAX_COORDINATOR_ADDRESS=<host:port> JAX_NUM_PROCESSES=<P> JAX_PROCESS_ID=<i>`` (or under SLURM or
Open MPI, which ``jax.distributed`` detects itself), and ``--data-parallel`` the global device count; ``main``
then calls ``jax.distributed.initialize`` and process 0 is the chief.

Loss. ``impl_jax.train.smoothed_loss`` divides the sum over the non-pad targets of the array it is given by their
count, and under ``jit`` that array is the global batch: a sharding changes where a value is computed, not what. So each
device's rows contribute ``sum_local / N_global`` to the loss and their share of the gradient, and the all-reduce
adds them: the global batch's loss and gradient, not a mean of per-worker means, with nothing to rescale (no
engine averages over devices here). Padding rows and positions are ``pad_id`` targets and count in neither.

Dropout. Masks as ``impl_jax.train_step`` draws them, from a key split off the state's one key (``init_train_state``:
``jax.random.key(seed)``, replicated on every device). ``jax.random`` bits are a function of the key and the
element's index in the global array, so device r draws the masks of its own rows (with ``jax_threefry_partitionable``,
JAX's default, it computes only those; without it each device would compute all and keep its own). They are the
masks one device draws for a batch whose rows lie as they lie on the N devices: where B and B/N are powers of two
(the demo's 64 rows, the tests' 8, on 2 devices: no padding rows), N devices and one draw the same masks.

Checkpoints. Nothing beyond ``spec.data_parallel``'s common files: the devices share the one key, which
``train_state.safetensors`` holds (its "rng"), so a resumed run draws the masks the uninterrupted run draws.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import impl_jax
from impl_jax import numerics, train
from impl_jax.model import Transformer, log
from impl_jax.train_state import TrainState
from impl_jax.weights import canonical
from spec import data_parallel, data_parallel_cli
from spec.data_parallel import Batch, Options

MODULE = "impl_jax.train_dp"


class DataParallel:
    """Data-parallel training over N devices of this process (``spec.data_parallel.Engine``) on ``jax.sharding``.

    ``DataParallel(options)`` builds ``impl_jax.Transformer(config, seed=seed)`` (the weights of
    ``spec.init_params``: the same in every backend) and ``init_train_state(model, train_config, seed=seed)``, both
    replicated on a mesh of the first ``options.data_parallel`` of ``jax.devices()``. Attributes: ``world`` (N),
    ``rank`` (this process's index, 0 with one process), ``chief`` (rank 0), ``model``, ``state`` (replicated
    arrays; the state's ``rng`` is the one dropout key).

    Raises:
        ValueError: if JAX has fewer than ``options.data_parallel`` devices (``main`` gives a CPU enough; a library
            caller sets ``jax_num_cpu_devices`` before JAX starts), or from ``init_train_state`` for a bad seed.
    """

    def __init__(self, o: Options):
        devices = jax.devices()
        if len(devices) < o.data_parallel:
            raise ValueError(f"{MODULE}: --data-parallel {o.data_parallel} needs as many devices; JAX has "
                             f"{len(devices)} ({devices[0].platform}). {MODULE}.main gives a CPU enough; elsewhere "
                             f"set jax_num_cpu_devices before JAX starts")
        self.options, self.world, self.rank = o, o.data_parallel, jax.process_index()
        self.chief = self.rank == 0
        mesh = Mesh(np.array(devices[:o.data_parallel]), ("data",))
        self._rows, self._replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
        model = impl_jax.Transformer(o.config, seed=o.seed)
        state = impl_jax.init_train_state(model, o.train_config, seed=o.seed)
        self.model, self.state = jax.device_put((model, state), self._replicated)

    def step(self, batch: Batch, keep_gradient: bool) -> tuple[float, dict[str, np.ndarray] | None]:
        """One Adam step on the global batch src (B, S), tgt_in (B, T), tgt_out (B, T) int64, device r computing on
        worker r's ``shard`` (B/N rows) in training mode: -> (the global batch's loss before the update, {canonical
        name: float32 global gradient, the parameter's shape} if ``keep_gradient`` else None).

        Raises:
            ValueError: from ``spec.validate.check_train_batch`` on the global batch, or if N does not divide B;
                before anything is computed.
        """
        s = self.state
        src, tgt_in, tgt_out = self._shards(batch)  # (N Bs, Sb), (N Bs, Tb), (N Bs, Tb) int32, sharded by rows
        # All replicated: loss () float32, the model, the state, the gradients if kept.
        loss, self.model, state, grads = train_step_program(self.model, s, src, tgt_in, tgt_out,
                                                            keep_gradient=keep_gradient)
        order = list(s.m)  # the jitted function's dicts come back in sorted key order
        self.state = dataclasses.replace(state, m={n: state.m[n] for n in order}, v={n: state.v[n] for n in order})
        kept = None if grads is None else {name: np.asarray(g) for name, g in _local(grads).items()}
        return float(np.asarray(_local(loss))), kept

    def params(self) -> dict[str, np.ndarray]:
        """{canonical name: float32 array}, the master weights on the host (this process's replica)."""
        return impl_jax.params_of(_local(self.model))

    def save(self, directory: Path) -> None:
        """The chief writes ``model.safetensors`` and ``train_state.safetensors`` (the dropout key in it; module
        docstring); returns once every process has reached this point."""
        if self.chief:
            model, state = _local((self.model, self.state))
            impl_jax.save_weights(model, directory / "model.safetensors")
            impl_jax.save_train_state(state, directory / "train_state.safetensors")
        self.barrier()

    def load(self, directory: Path) -> None:
        """Restore weights, Adam's moments and step, and the dropout key from a folder ``save`` wrote, bit for bit,
        replicated on the mesh.

        Raises:
            ValueError: from ``impl_jax.load_weights`` / ``load_train_state`` for a bad or foreign file.
        """
        model = impl_jax.load_weights(directory / "model.safetensors", self.model.config)
        state = impl_jax.load_train_state(directory / "train_state.safetensors", model)
        self.model, self.state = jax.device_put((model, state), self._replicated)

    def barrier(self) -> None:
        """Returns once every process has reached it: at once with one process (its devices run one program)."""
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(MODULE)

    def _shards(self, batch: Batch) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The global batch checked, each worker's ``shard`` padded to the batch bucket of B/N rows and the
        global batch's length buckets, laid out by rows on the mesh: int32 (N Bs, Sb), (N Bs, Tb), (N Bs, Tb),
        device r holding shard r and its padding rows (Bs = ``batch_bucket(B / N)``; N Bs always divides by N).

        Raises:
            ValueError: from ``spec.data_parallel.padded_shards`` (a bad batch, or N does not divide B).
        """
        shards = data_parallel.padded_shards(batch, self.world, self.model.config)  # N x ((Bs, Sb), (Bs, Tb) x2)
        host = [np.concatenate([part[i] for part in shards]) for i in range(3)]  # (N Bs, Sb), (N Bs, Tb) x2 int32
        return tuple(jax.make_array_from_callback(x.shape, self._rows, x.__getitem__)
                     for x in host)  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m impl_jax.train_dp``: ``spec.data_parallel_cli.main`` on ``DataParallel`` (its result).

    Process-wide state, as a command line may, before JAX's backend starts: with ``JAX_COORDINATOR_ADDRESS`` set,
    ``jax.distributed.initialize`` (several processes; module docstring); otherwise, where the platform is the CPU
    (or not chosen: JAX then prefers an accelerator, and the setting only sizes the unused CPU backend) and its
    backend would have fewer devices than ``--data-parallel``, ``jax_num_cpu_devices``.

    Raises:
        SystemExit: on a bad command line (status 2); if JAX's backend already started with fewer devices than
            ``--data-parallel`` (a caller ran JAX in this process first), or ``--kill-at`` names a rank that is not
            a process of this run.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    o = data_parallel_cli.options(argv, f"python -m {MODULE}")
    if "JAX_COORDINATOR_ADDRESS" in os.environ:
        env = {k: int(os.environ[k]) if k in os.environ else None for k in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID")}
        jax.distributed.initialize(num_processes=env["JAX_NUM_PROCESSES"], process_id=env["JAX_PROCESS_ID"])
    else:
        _devices(o.data_parallel)
    if o.kill_at and not 0 <= o.kill_at[1] < jax.process_count():
        raise SystemExit(f"{MODULE}: --kill-at {o.kill_at[0]}:{o.kill_at[1]}: the rank is a process, and this run "
                         f"has {jax.process_count()} (one process drives the devices of its host)")
    return data_parallel_cli.main(impl_jax, DataParallel, argv)


# ----------------------------------------------------------------- internals

def _devices(n: int) -> None:
    """Give JAX's CPU backend ``n`` devices before it starts, where the platform is the CPU (or not chosen) and it
    would have fewer.

    Raises:
        SystemExit: if the backend already started with fewer than ``n`` devices.
    """
    platform = (jax.config.jax_platforms or "").split(",")[0]
    flag = re.search(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
    count = jax.config.jax_num_cpu_devices if jax.config.jax_num_cpu_devices >= 0 else int(flag.group(1)) if flag else 1
    if platform not in ("", "cpu") or count >= n:  # the devices JAX's CPU backend will have
        return
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:  # JAX's validator: the backend has started, and its devices are fixed
        if jax.device_count() < n:
            raise SystemExit(f"{MODULE}: --data-parallel {n}, but JAX's backend already started in this process "
                             f"with {jax.device_count()} device(s); run the command in a process of its own, or "
                             f"set jax_num_cpu_devices to {n} before JAX starts") from None


@functools.partial(numerics.jit, static_argnames=("keep_gradient",))
def train_step_program(model: Transformer, state: TrainState, src: jax.Array, tgt_in: jax.Array, tgt_out: jax.Array,
                       keep_gradient: bool):
    """The jitted program ``DataParallel.step`` runs on the sharded global batch (``.lower`` it to inspect it):
    src (B, S), tgt_in (B, T), tgt_out (B, T) int32 -> (loss, new model, new state, {canonical name: fp32 global
    gradient} if ``keep_gradient`` else None): the step of ``impl_jax.train_step`` on the global batch (without the
    gradient, XLA keeps it nowhere)."""
    c, tc = model.config, state.train_config
    log.info("impl_jax: compiling train_step%s for batch %d, source length %d, target length %d (buckets)",
             " keeping the gradient" if keep_gradient else "", *src.shape, tgt_in.shape[1])
    rng, key = jax.random.split(state.rng)
    loss, grads = jax.value_and_grad(
        lambda m: train.smoothed_loss(m(src, tgt_in, rng=key), tgt_out, tc.label_smoothing, c.pad_id))(
        jax.tree.map(lambda p: p.astype(jnp.float32), model))  # fp32 master weights (exact): fp32 gradients
    grads = canonical(grads)
    params, state = train.adam_update(canonical(model), grads, state)
    return (loss, Transformer(c, params=params), dataclasses.replace(state, rng=rng),
            grads if keep_gradient else None)


def _local(tree: Any) -> Any:
    """A pytree of replicated arrays as this process's copy (single-device arrays), whatever the process count."""
    return jax.tree.map(lambda x: x.addressable_data(0), tree)


if __name__ == "__main__":
    main(sys.argv[1:])
