"""Data-parallel training on ``tf.distribute``: the command line of ``spec.data_parallel``.

    python -m impl_tf.train_dp --data-parallel 2 [--steps N] [--checkpoint-dir D [--resume]] [--record R]

Engine. ``tf.distribute.MirroredStrategy`` over N devices of this process: the first N GPUs where TensorFlow sees
GPUs, else N logical CPU devices, which ``main`` makes of the CPU before TensorFlow's runtime starts. The model and
the train state are created in ``strategy.scope()``, so every variable (weights, Adam's moments, the step, the
dropout generator's state) is a ``MirroredVariable``, one copy per device. A step is one ``tf.function``
(``impl_tf.train.mirrored_step``): the global batch's ``spec.data_parallel.shard`` of each replica
(``experimental_distribute_values_from_function``, by ``replica_id_in_sync_group``, padded to the batch bucket of B/N
rows and the global batch's length buckets) goes to ``strategy.run`` of a per-replica XLA program
(``jit_compile=True``: the forward and ``tf.GradientTape``'s gradients of ``impl_tf.train``); the strategy's
cross-device ops all-reduce the gradients (``strategy.extended.batch_reduce_to``, SUM, onto the variables' devices:
TensorFlow's collective all-reduce) and ``strategy.extended.update`` applies ``impl_tf.train``'s Adam to each
device's copy, the same arithmetic on the same values in every replica. One process, so ``world`` is N, ``rank`` 0,
``chief`` True and ``barrier`` a no-op; ``--data-parallel 1`` is the same program on a strategy of one device.
Several hosts (untested here): one process per host, each with ``TF_CONFIG`` naming the cluster's "worker" tasks and
its own index (worker 0 is the chief), and ``--data-parallel`` the total replica count; ``DataParallel`` then uses
``MultiWorkerMirroredStrategy``, whose collectives span the hosts.

Loss. Replica r computes the label-smoothed loss of its shard summed over its non-pad targets and divided by the
*global* batch's ``token_count`` N (``impl_tf.train.smoothed_loss`` with ``count``), so the replicas' shares, and
their gradients, add up to the global batch's loss and gradient (not a mean of per-worker means); the reduction is a
SUM (no engine averages here, so nothing is rescaled). Padding rows and positions are ``pad_id`` targets and count
in neither.

Dropout. Masks as ``impl_tf.train_step`` draws them (``layers.dropout``, stateless ops from a seed drawn from the
train state's ``tf.random.Generator``, never TensorFlow's global RNG), each replica from its own stream: the
generator, seeded with ``--seed`` as ``init_train_state`` seeds it and created in the strategy's scope, hashes the
replica's id into its key when it is drawn from in replica context (``tf.random.Generator``'s documented behaviour
under a strategy), while every replica advances its copy of the state by the same amount.

Checkpoints. Nothing beyond ``spec.data_parallel``'s common files: every replica's stream is a function of the one
generator state (identical in all copies, checked when saving) and the replica's id, and ``train_state.safetensors``
holds that state (its "rng"), so a resumed run draws the masks the uninterrupted run draws.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

import impl_tf
from impl_tf import train
from impl_tf.numerics import numerics_scope
from spec import data_parallel, data_parallel_cli, weights_io
from spec.data_parallel import Batch, Options

MODULE = "impl_tf.train_dp"


class DataParallel:
    """Data-parallel training over N devices (``spec.data_parallel.Engine``) on ``tf.distribute``.

    ``DataParallel(options)`` makes the strategy (module docstring: ``MirroredStrategy`` over the first
    ``options.data_parallel`` GPUs, else logical CPU devices; ``MultiWorkerMirroredStrategy`` with ``TF_CONFIG``)
    and, in its scope, ``impl_tf.Transformer(config, seed=seed)`` (the weights of ``spec.init_params``: the same in
    every backend) and ``init_train_state(model, train_config, seed=seed)``, all mirrored. Attributes: ``world``
    (N), ``rank`` (this process's index, 0 with one process), ``chief`` (rank 0), ``strategy``, ``model``,
    ``state`` (its ``rng`` is the one dropout generator, per-replica streams).

    Raises:
        ValueError: if there are fewer than ``options.data_parallel`` devices (``main`` makes enough CPU devices;
            a library caller calls ``tf.config.set_logical_device_configuration`` before TensorFlow starts), or
            ``TF_CONFIG``'s cluster has another replica count; from ``init_train_state`` for a bad seed.
    """

    def __init__(self, o: Options):
        if "TF_CONFIG" in os.environ:
            self.strategy = tf.distribute.MultiWorkerMirroredStrategy()
        else:
            devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
            if len(devices) < o.data_parallel:
                raise ValueError(f"{MODULE}: --data-parallel {o.data_parallel} needs as many devices; TensorFlow has "
                                 f"{len(devices)} ({devices[0].device_type}). {MODULE}.main splits a CPU into enough; "
                                 f"elsewhere call tf.config.set_logical_device_configuration before TensorFlow starts")
            self.strategy = tf.distribute.MirroredStrategy([d.name for d in devices[:o.data_parallel]])
        resolver = getattr(self.strategy, "cluster_resolver", None)  # this process's TF_CONFIG task, if any
        self.options, self.world = o, self.strategy.num_replicas_in_sync
        self.rank = int(resolver.task_id or 0) if resolver is not None and resolver.task_type else 0
        if self.world != o.data_parallel:
            raise ValueError(f"{MODULE}: --data-parallel {o.data_parallel}, but TF_CONFIG's cluster has "
                             f"{self.world} replicas")
        self.chief = self.rank == 0
        self._buckets = set()  # shapes the step was given so far: XLA compiled each once
        with self.strategy.scope():  # variables made here are mirrored, one copy per device
            self.model = impl_tf.Transformer(o.config, seed=o.seed)
            self.state = impl_tf.init_train_state(self.model, o.train_config, seed=o.seed)
        # ``impl_tf.train.mirrored_step`` as one tf.function: traced for the first bucket, shape-polymorphic from the
        # second.
        self._program = tf.function(lambda *args: train.mirrored_step(self.model, self.state, self.strategy, *args),
                                    reduce_retracing=True)

    def step(self, batch: Batch, keep_gradient: bool) -> tuple[float, dict[str, np.ndarray] | None]:
        """One Adam step on the global batch src (B, S), tgt_in (B, T), tgt_out (B, T) int64, replica r computing on
        worker r's ``shard`` (B/N rows) in training mode: -> (the global batch's loss before the update, {canonical
        name: float32 global gradient, the parameter's shape} if ``keep_gradient`` else None).

        Raises:
            ValueError: from ``spec.validate.check_train_batch`` on the global batch, or ``spec.data_parallel.shard``
                if N does not divide B; before anything is computed.
        """
        config = self.model.config
        shards = self._shards(batch)                                   # PerReplica (Bs, Sb), (Bs, Tb), (Bs, Tb)
        count = tf.constant(data_parallel.token_count(batch[2], config.pad_id), tf.float32)  # () N, exact in fp32
        loss, grads = self._program(*shards, count, train.adam_scalars(self.model, self.state))
        self.state.step.assign_add(1)
        kept = None
        if keep_gradient:
            kept = {name: g.numpy() for name, g in zip(self.model.params, grads, strict=True)}  # fp32
        return float(loss), kept

    def params(self) -> dict[str, np.ndarray]:
        """{canonical name: float32 array}, the master weights on the host (the first device's copy; every copy
        is the same)."""
        return impl_tf.params_of(self.model)

    def save(self, directory: Path) -> None:
        """The chief writes ``model.safetensors`` and ``train_state.safetensors`` (the dropout generator's state in
        it; module docstring); returns once every process has reached this point.

        Raises:
            RuntimeError: if the devices' copies of the generator state differ (a replica drew other seeds).
        """
        if self.chief:
            states = {tuple(x.numpy()) for x in self.strategy.experimental_local_results(self.state.rng.state)}
            if len(states) != 1:
                raise RuntimeError(f"{MODULE}: the replicas' dropout generator states differ: {sorted(states)}")
            impl_tf.save_weights(self.model, directory / "model.safetensors")
            impl_tf.save_train_state(self.state, directory / "train_state.safetensors")
        self.barrier()

    def load(self, directory: Path) -> None:
        """Restore weights, Adam's moments and step, and the dropout generator from a folder ``save`` wrote, bit
        for bit, into every device's copy (assigned in place: the traced step keeps its variables).

        Raises:
            ValueError: from ``spec.weights_io.load_weights`` / ``impl_tf.load_train_state`` for a bad or foreign
                file.
        """
        _, params = weights_io.load_weights(directory / "model.safetensors", self.model.config)
        stored = impl_tf.load_train_state(directory / "train_state.safetensors", self.model)  # not mirrored
        for name, p in self.model.params.items():
            p.assign(params[name])  # in cross-replica context: every copy
            self.state.m[name].assign(stored.m[name])
            self.state.v[name].assign(stored.v[name])
        self.state.step.assign(stored.step)
        self.state.rng.reset(stored.rng.state)
        self.state.train_config = stored.train_config

    def barrier(self) -> None:
        """Returns once every process has reached it: at once with one process (its devices run one program),
        else after an all-reduce that every worker joins."""
        if isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy):
            self.strategy.reduce(train.SUM, self.strategy.run(lambda: tf.constant(1.0)), axis=None)

    def _shards(self, batch: Batch) -> tuple[Any, Any, Any]:
        """The global batch checked, each replica's ``shard`` padded with ``pad_id`` to the batch bucket of B/N rows
        and the global batch's length buckets: per-replica int32 (Bs, Sb), (Bs, Tb), (Bs, Tb). Logs a new bucket.

        Raises:
            ValueError: from ``spec.data_parallel.padded_shards`` (a bad batch, or N does not divide B).
        """
        shards = data_parallel.padded_shards(batch, self.world, self.model.config)  # N x ((Bs, Sb), (Bs, Tb) x2)
        (Bs, Sb), Tb = shards[0][0].shape, shards[0][1].shape[1]
        if (Bs, Sb, Tb) not in self._buckets:
            self._buckets.add((Bs, Sb, Tb))
            logging.getLogger("impl_tf").info("impl_tf: compiling train_dp step for %s replica(s) of shape %s",
                                              self.world, (Bs, Sb, Tb))

        def replica_rows(ctx: tf.distribute.ValueContext) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
            return tuple(tf.constant(x) for x in shards[ctx.replica_id_in_sync_group])

        return self.strategy.experimental_distribute_values_from_function(replica_rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m impl_tf.train_dp``: ``spec.data_parallel_cli.main`` on ``DataParallel`` (its result).

    Process-wide state, as a command line may: without ``TF_CONFIG`` and without GPUs, the CPU is split into
    ``--data-parallel`` logical devices (``tf.config.set_logical_device_configuration``) before TensorFlow's
    runtime starts. The run is inside ``numerics_scope`` (TF32 off: fp32 products stay fp32 on GPUs).

    Raises:
        SystemExit: on a bad command line (status 2); if TensorFlow's runtime already started in this process
            with fewer CPU devices than ``--data-parallel``, or ``--kill-at`` names a rank that is not a process of
            this run.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    o = data_parallel_cli.options(argv, f"python -m {MODULE}")
    if "TF_CONFIG" not in os.environ:
        _devices(o.data_parallel)
        if o.kill_at and o.kill_at[1] != 0:
            raise SystemExit(f"{MODULE}: --kill-at {o.kill_at[0]}:{o.kill_at[1]}: the rank is a process, and this "
                             f"run has one (its {o.data_parallel} devices are driven by one process); use rank 0")
    with numerics_scope():
        return data_parallel_cli.main(impl_tf, DataParallel, argv)


# ----------------------------------------------------------------- internals

def _devices(n: int) -> None:
    """Split the CPU into ``n`` logical devices before TensorFlow's runtime starts, where it sees no GPU and would
    have fewer.

    Raises:
        SystemExit: if the runtime already started with fewer than ``n`` CPU devices.
    """
    if tf.config.list_physical_devices("GPU"):
        return
    cpu = tf.config.list_physical_devices("CPU")[0]
    if len(tf.config.get_logical_device_configuration(cpu) or [None]) >= n:
        return
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
    except RuntimeError:  # "Virtual devices cannot be modified after being initialized"
        have = len(tf.config.list_logical_devices("CPU"))
        if have < n:
            raise SystemExit(f"{MODULE}: --data-parallel {n}, but TensorFlow's runtime already started in this "
                             f"process with {have} CPU device(s); run the command in a process of its own, or call "
                             f"tf.config.set_logical_device_configuration before TensorFlow starts") from None


if __name__ == "__main__":
    main(sys.argv[1:])
