"""Data-parallel training on ``torch.distributed``: the command line of ``spec.data_parallel``.

    python -m impl_torch.train_dp --data-parallel 2 [--steps N] [--checkpoint-dir D [--resume]] [--record R]
    torchrun --nproc-per-node 2 -m impl_torch.train_dp --data-parallel 2 ...        (the same, launched by hand)

Engine. ``torch.nn.parallel.DistributedDataParallel`` over ``torch.distributed``: backend "gloo" on the CPU,
"nccl" on CUDA (device ``cuda:<LOCAL_RANK>``), one process per worker. ``--data-parallel N`` > 1 outside
``torchrun`` re-launches the same command under torch's own launcher (``torch.distributed.run``, ``--standalone``
on this host, in this process), which starts N workers, tears the others down when one fails and exits non-zero
naming the failed rank and its signal or exit code. ``--data-parallel 1`` runs in this process on the same code
path: DDP over a one-process gloo group whose store is in memory (``torch.distributed.HashStore``), so one device
is the same program as N workers.

Loss. Worker r computes the label-smoothed loss of its ``shard`` of the global batch summed over its non-pad
targets and divided by the *global* batch's ``token_count`` N, so the workers' shares add up to the loss of the
global batch (not a mean of per-worker means). DDP averages the gradients over the W workers during ``backward``,
so the loss it differentiates is ``W * share``: the average of the W workers' ``W * grad(share)`` is the sum of
their shares' gradients, the gradient of the global loss (for W a power of two the scaling by W and DDP's division
by W are exact). The loss reported is the sum of the shares (``all_reduce``, a reporting value only). Adam is
``impl_torch.train``'s, on the fp32 master weights, identical in every worker.

Dropout. Masks as ``impl_torch.train_step`` draws them (a ``torch.Generator`` passed down as ``rng``,
never torch's global RNG), each worker from its own generator: worker 0's is the train state's, seeded with
``--seed`` as ``init_train_state`` seeds it (so one worker draws the masks ``train_step`` would), worker r > 0's is
seeded with ``numpy.random.SeedSequence([seed, r])``'s first 32-bit word (a hash: no two workers, and no worker of
another seed's run, share a stream by construction).

Checkpoints. Beyond ``spec.data_parallel``'s common files (``model.safetensors``, ``train_state.safetensors``
holding worker 0's generator, ``progress.json``): ``rng-<r>.npy``, the state of worker r's generator (uint8, as
``torch.Generator.get_state``), for every r > 0, so that a resumed run with dropout is bit-identical.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.run
from torch import Tensor
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.nn.parallel import DistributedDataParallel

import impl_torch
from impl_torch.inputs import device_ids, host_ids
from impl_torch.numerics import numerics_scope
from impl_torch.train import adam_update, smoothed_loss
from spec import data_parallel, data_parallel_cli, validate
from spec.data_parallel import Batch, Options

MODULE = "impl_torch.train_dp"
# How long a collective waits for a missing peer before it raises. A worker that dies is noticed far sooner (its
# sockets close, and the launcher stops the rest); this bounds a peer that hangs without dying.
TIMEOUT = datetime.timedelta(minutes=10)


class DataParallel:
    """One worker of data-parallel training (``spec.data_parallel.Engine``) on ``DistributedDataParallel``.

    ``DataParallel(options)`` builds ``impl_torch.Transformer(config, seed=seed)`` (the weights of
    ``spec.init_params``: the same in every worker and every backend) and ``init_train_state(model, train_config,
    seed=seed)``, wraps the model in DDP over torch.distributed's default process group, which must be initialised
    with ``options.data_parallel`` processes (``main`` does it), and seeds this worker's dropout generator (module
    docstring). Attributes: ``world``, ``rank``, ``chief`` (rank 0), ``model``, ``state`` (its ``rng`` is this
    worker's dropout generator).

    Raises:
        ValueError: if no process group is initialised, or its size is not ``options.data_parallel``.
    """

    def __init__(self, o: Options):
        if not dist.is_initialized():
            raise ValueError(f"{MODULE}: DataParallel needs torch.distributed's process group; run it through "
                             f"{MODULE}.main or torchrun")
        if dist.get_world_size() != o.data_parallel:
            raise ValueError(f"{MODULE}: --data-parallel {o.data_parallel}, but the process group has "
                             f"{dist.get_world_size()} processes")
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.chief = self.rank == 0
        device = _device()
        self.model = impl_torch.Transformer(o.config, seed=o.seed, device=device)
        self.state = impl_torch.init_train_state(self.model, o.train_config, seed=o.seed)
        if self.rank:  # SeedSequence([seed, rank])'s first 32-bit word: a hash, no stream shared by construction
            self.state.rng.manual_seed(int(np.random.SeedSequence([o.seed, self.rank]).generate_state(1)[0]))
        # The positional table, the only buffer, is a function of the config: synced at init (with the weights,
        # a check that every worker starts alike), never again before a forward.
        self.ddp = DistributedDataParallel(self.model, device_ids=[device] if device.type == "cuda" else None,
                                           forward_sync_buffers=False)

    def step(self, batch: Batch, keep_gradient: bool) -> tuple[float, dict[str, np.ndarray] | None]:
        """One Adam step on the global batch src (B, S), tgt_in (B, T), tgt_out (B, T) int64, this worker computing
        on its shard (B/W rows, ``_shards``) with dropout: -> (the global batch's loss before the update, {canonical
        name: float32 global gradient, the parameter's shape} if ``keep_gradient`` else None).

        Raises:
            ValueError: from ``spec.validate.check_train_batch`` on the global batch, before anything is computed.
        """
        names = ("src", "tgt_in", "tgt_out")
        validate.check_train_batch(*(host_ids(ids, n) for ids, n in zip(batch, names, strict=True)), self.model.config)
        n = data_parallel.token_count(batch[2], self.model.config.pad_id)   # N: the global batch's targets
        # This worker's forward and backward through DDP on its shard: its share ``sum_local / N``; DDP leaves the
        # global gradient (the all-reduced average of the workers' ``W * share``) in each parameter's ``.grad``.
        src, tgt_in, tgt_out = self._shards(batch)                           # (B/W, S|T)
        self.ddp.zero_grad(set_to_none=True)
        with torch.enable_grad():
            logits = self.ddp(src, tgt_in, rng=self.state.rng)                              # (B/W, T, V) float32
            share = smoothed_loss(logits, tgt_out, self.state.train_config.label_smoothing,
                                  self.model.config.pad_id, count=n)                         # () float32
            (share * self.world).backward()  # DDP divides by W while it all-reduces
        loss = share.detach().clone()                                       # () float32
        dist.all_reduce(loss)  # the sum of the shares: the global loss, for reporting (no gradient flows here)
        # DDP's average over the workers, the global gradient: {name: float32, the parameter's shape}.
        params = dict(self.model.named_parameters())
        grads = {name: p.grad for name, p in params.items()}
        adam_update(params, grads, self.state)
        kept = {name: g.cpu().numpy().copy() for name, g in grads.items()} if keep_gradient else None
        return float(loss), kept

    def params(self) -> dict[str, np.ndarray]:
        """{canonical name: float32 array}, the master weights on the host (bit-identical in every worker)."""
        return impl_torch.params_of(self.model)

    def save(self, directory: Path) -> None:
        """The chief writes ``model.safetensors`` and ``train_state.safetensors`` (its own generator in it), every
        other worker ``rng-<rank>.npy``; returns once all have."""
        if self.chief:
            impl_torch.save_weights(self.model, directory / "model.safetensors")
            impl_torch.save_train_state(self.state, directory / "train_state.safetensors")
        else:
            np.save(directory / f"rng-{self.rank}.npy", self.state.rng.get_state().numpy())
        self.barrier()

    def load(self, directory: Path) -> None:
        """Restore weights, Adam's moments and step, and this worker's generator from a folder ``save`` wrote.

        Raises:
            ValueError: from ``impl_torch.load_weights`` / ``load_train_state`` for a bad or foreign file.
            FileNotFoundError: if this worker's ``rng-<rank>.npy`` is missing.
        """
        stored = impl_torch.load_weights(directory / "model.safetensors", self.model.config,
                                         device=self.model.embedding.device)
        self.model.load_state_dict(stored.state_dict())  # in place: DDP's hooks stay on these parameters
        state = impl_torch.load_train_state(directory / "train_state.safetensors", self.model)
        if self.rank:
            state.rng.set_state(torch.from_numpy(np.load(directory / f"rng-{self.rank}.npy")))
        self.state = state

    def barrier(self) -> None:
        """Returns once every worker has reached it."""
        dist.barrier()

    def _shards(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        """This worker's shard of the global batch (``spec.data_parallel.shard``, rows r*B/W..): src (B/W, S),
        tgt_in and tgt_out (B/W, T) as int64 tensors on the model's device."""
        src, tgt_in, tgt_out = data_parallel.shard(batch, self.rank, self.world)
        dev = self.model.embedding.device
        return device_ids(src, dev), device_ids(tgt_in, dev), device_ids(tgt_out, dev)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m impl_torch.train_dp``: ``spec.data_parallel_cli.main`` in each worker (its result: the chief's
    summary, a worker's own losses). With ``--data-parallel N`` > 1 outside torchrun, re-launches the command under
    ``torch.distributed.run`` and returns {"framework", "data_parallel", "launcher"} once every worker succeeded.

    Process-wide state, as a command line may: the default process group (destroyed on return), the CUDA device
    of the worker, ``numerics_scope``'s matmul flags for the run; the launcher sets ``OMP_NUM_THREADS`` to 1 for
    N > 1 workers unless it is set.

    Raises:
        SystemExit: on a bad command line (status 2); if torchrun's WORLD_SIZE is not ``--data-parallel``; non-zero
            with torchrun's report (the failed rank and its exit code or signal) if a worker fails.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    o = data_parallel_cli.options(argv, f"python -m {MODULE}")
    torchrun = "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ  # launched by torchrun
    if o.data_parallel > 1 and not torchrun:
        return _launch(o.data_parallel, argv)
    with _process_group(o.data_parallel, torchrun), numerics_scope():
        return data_parallel_cli.main(impl_torch, DataParallel, argv)


# ----------------------------------------------------------------- internals

def _device() -> torch.device:
    """This worker's device: ``cuda:<LOCAL_RANK>`` where CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def _launch(workers: int, argv: list[str]) -> dict[str, Any]:
    """This command under torch's launcher, ``workers`` processes on this host.

    Raises:
        SystemExit: with torchrun's report of the first failure (rank, exit code or signal) if any worker fails.
    """
    try:
        torch.distributed.run.main(["--standalone", "--nproc-per-node", str(workers), "-m", MODULE, *argv])
    except ChildFailedError as e:
        # torchrun's own report, without the launcher's traceback (which says nothing of the workers).
        raise SystemExit(f"{MODULE}: a worker failed: {type(e).__name__} from torch.distributed.run:\n{e}") from None
    return {"framework": "torch", "data_parallel": workers, "launcher": "torch.distributed.run"}


@contextlib.contextmanager
def _process_group(workers: int, torchrun: bool) -> Iterator[None]:
    """torch.distributed's default process group for this run, destroyed after: with ``torchrun``, torchrun's
    (``env://``), else a one-process group over an in-memory store; gloo on the CPU, nccl on CUDA.

    Raises:
        SystemExit: if torchrun's WORLD_SIZE is not ``workers``.
    """
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torchrun:
        world = int(os.environ["WORLD_SIZE"])
        if world != workers:
            raise SystemExit(f"{MODULE}: --data-parallel {workers}, but torchrun started {world} processes "
                             f"(WORLD_SIZE); give torchrun --nproc-per-node {workers} (times its nodes)")
        if backend == "nccl":
            torch.cuda.set_device(_device())
        dist.init_process_group(backend, timeout=TIMEOUT)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=TIMEOUT)
    try:
        yield
    finally:
        # The engine is garbage in reference cycles (DDP's) by now, and its reducer holds the gloo group: collected
        # only at interpreter exit, the group's threads outlived the interpreter and a worker aborted in 4 of 15
        # runs ("terminate called without an active exception", SIGABRT, after training); freed here, 0 of 20.
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
