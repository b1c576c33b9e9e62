"""Data-parallel training: the data, split, loop, checkpoints and records every impl shares (the command line that
drives them: ``spec.data_parallel_cli``).

Each impl runs the loop here on its framework's own engine (``impl_torch.train_dp``: ``DistributedDataParallel``
under ``torchrun``; ``impl_jax.train_dp``: ``jax.sharding`` under ``jax.jit``; ``impl_tf.train_dp``:
``tf.distribute.MirroredStrategy``), through the small ``Engine`` protocol below. The same command in all three::

    python -m impl_torch.train_dp --data-parallel 2 --steps 300 --checkpoint-dir ckpt [--resume] [--record rec]

Data. The global batch of step k (1-based) is ``spec.demo.reverse_batch`` drawn from ``default_rng([seed, k])``:
a function of the step alone, so the data position of a checkpoint is its step, and N workers see exactly the
batches one device sees. Worker r of N takes rows ``[r B/N, (r + 1) B/N)`` (``shard``); their token counts differ
(sequences are 8-16 tokens), which is the case the loss must weigh right.

Loss. The loss of a step is the global batch's: the sum over its non-pad targets divided by ``token_count`` of
the *global* batch (spec.training), not the mean of per-worker means, which would weigh a worker's tokens by the
inverse of its token count. A worker's share is ``sum_local / N_global``; summing the shares (and their gradients)
over workers gives the global loss and gradient. An engine that averages gradients over W workers (DDP) is given
``W * sum_local / N_global``.

Checkpoints (``--checkpoint-dir``, every ``--checkpoint-every`` steps and at the end): ``step-<k>/`` holding
``model.safetensors`` (``save_weights``), ``train_state.safetensors`` (``save_train_state``: Adam's moments, the
schedule's step, the chief's dropout RNG), any per-worker RNG files the engine writes, and ``progress.json``
(step, workers, batch, seed, config). Written into a temporary folder and renamed when complete, so a worker
killed mid-write leaves the previous checkpoint intact; ``--resume`` continues from the newest complete one and
ends bit-identical to a run never stopped.

Records (``--record DIR``, for the conformance suite): ``losses.json`` (the loss and seconds of every step) and,
after each step k of ``--record-steps``, ``params_<k>.safetensors`` (canonical names, float32 master weights) and
``grad_<k>.safetensors`` (the global gradient that step applied).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from spec import demo, shapes, training, validate, weights_io
from spec.config import Config
from spec.training import TrainConfig

Batch = tuple[np.ndarray, np.ndarray, np.ndarray]  # src (B, S), tgt_in (B, T), tgt_out (B, T) int64


def global_batch(config: Config, step: int, batch: int, seed: int) -> Batch:
    """The global batch of step ``step`` (1-based): ``demo.reverse_batch`` from ``default_rng([seed, step])``.

    Raises:
        ValueError: if ``step`` < 1, or from ``reverse_batch``.
    """
    if step < 1:
        raise ValueError(f"global_batch: steps count from 1, got {step}")
    return demo.reverse_batch(np.random.default_rng([seed, step]), config, batch)


def shard(arrays: Batch, rank: int, world: int) -> Batch:
    """Worker ``rank``'s rows of a global batch: ``[rank B/world, (rank + 1) B/world)`` of each array.

    Raises:
        ValueError: if ``world`` does not divide B, or ``rank`` is not in [0, world).
    """
    B = arrays[0].shape[0]
    if world < 1 or B % world or not 0 <= rank < world:
        raise ValueError(f"shard: a batch of {B} rows splits into {world} equal parts, worker {rank} of them; "
                         f"the global batch must be a multiple of the number of workers")
    rows = slice(rank * B // world, (rank + 1) * B // world)
    return tuple(a[rows] for a in arrays)  # type: ignore[return-value]


def padded_shards(batch: Batch, world: int, config: Config) -> list[Batch]:
    """The global batch checked, then each worker's ``shard`` padded with ``pad_id`` to the batch bucket of B/N rows
    and the global batch's length buckets: for rank r, int32 src (Bs, Sb), tgt_in (Bs, Tb), tgt_out (Bs, Tb)
    (``spec.shapes``), so every worker compiles one program shape. Pad rows and columns carry no targets.

    Raises:
        ValueError: from ``spec.validate.check_train_batch``, or ``shard`` if ``world`` does not divide B.
    """
    src, tgt_in, tgt_out = (np.asarray(x) for x in batch)                                 # (B, S), (B, T), (B, T)
    validate.check_train_batch(src, tgt_in, tgt_out, config)
    parts = [shard((src, tgt_in, tgt_out), r, world) for r in range(world)]
    Bs = shapes.batch_bucket(src.shape[0] // world)
    lengths = [shapes.length_bucket(n, config.max_len) for n in (src.shape[1], tgt_in.shape[1], tgt_in.shape[1])]
    return [tuple(shapes.pad_ids(x, Bs, L, config.pad_id) for x, L in zip(part, lengths, strict=True))
            for part in parts]


def token_count(tgt_out: np.ndarray, pad_id: int) -> int:
    """N: the non-pad targets of a (global) batch, the loss's denominator for every worker (spec.training)."""
    return int((np.asarray(tgt_out) != pad_id).sum())


class Engine(Protocol):
    """One process's view of data-parallel training on its framework's engine.

    ``world`` workers in all (processes x devices); ``chief`` is True in the one process that writes files and
    prints. An engine holds the model and train state of ``T.init_train_state``, replicated on every worker.
    """

    world: int
    chief: bool

    def step(self, batch: Batch, keep_gradient: bool) -> tuple[float, dict[str, np.ndarray] | None]:
        """One Adam step on the global batch (each worker computing on its ``shard``, the gradient reduced by the
        engine): -> (the global batch's loss before the update, {name: float32 global gradient} if
        ``keep_gradient`` else None)."""

    def params(self) -> dict[str, np.ndarray]:
        """The current weights, canonical names, on the host (the same in every worker)."""

    def save(self, directory: Path) -> None:
        """Every process writes its part of a checkpoint into ``directory`` (the chief ``model.safetensors`` and
        ``train_state.safetensors``); returns once all have (a barrier)."""

    def load(self, directory: Path) -> None:
        """Every process restores model, train state and its dropout RNG from a checkpoint ``save`` wrote."""

    def barrier(self) -> None:
        """Returns once every process has reached it."""


@dataclasses.dataclass(frozen=True)
class Options:
    """The parsed command line (``spec.data_parallel_cli.parser``)."""

    data_parallel: int
    steps: int
    batch: int
    seed: int
    config: Config
    train_config: TrainConfig
    checkpoint_dir: Path | None
    checkpoint_every: int
    resume: bool
    record: Path | None
    record_steps: tuple[int, ...]
    min_accuracy: float | None
    kill_at: tuple[int, int] | None


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete ``step-<k>`` folder under ``root`` (None if there is none)."""
    done = sorted(root.glob("step-*/progress.json")) if root.is_dir() else []
    return done[-1].parent if done else None


def write_checkpoint(engine: Engine, root: Path, step: int, o: Options, framework: str) -> None:
    """Every process writes its part into ``root/.step-<k>.tmp`` (``engine.save``); the chief then adds
    ``progress.json`` and renames the folder to ``step-<k>``, so only complete checkpoints carry that name."""
    final, tmp = root / f"step-{step:08d}", root / f".step-{step:08d}.tmp"
    if engine.chief:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    engine.barrier()
    engine.save(tmp)
    if engine.chief:
        (tmp / "progress.json").write_text(json.dumps(_progress(step, o, framework), indent=1))
        os.replace(tmp, final)
    engine.barrier()


def resume(engine: Engine, o: Options, framework: str) -> int:
    """Restore the newest checkpoint of ``o.checkpoint_dir`` into ``engine``: -> its step (0 if there is none).

    Raises:
        ValueError: if the checkpoint was written by a run with other workers, batch, seed, config or framework
            (its data or arithmetic would differ).
    """
    path = latest_checkpoint(o.checkpoint_dir)
    if path is None:
        return 0
    stored = json.loads((path / "progress.json").read_text())
    want = _progress(stored["step"], o, framework)
    diff = [k for k in want if stored.get(k) != want[k]]
    if diff:
        raise ValueError(f"{path}: written by a run with other {', '.join(diff)} "
                         f"({', '.join(f'{k}={stored.get(k)!r}' for k in diff)}); resume with the same options")
    engine.load(path)
    return int(stored["step"])


def run(engine: Engine, o: Options, framework: str, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train ``engine`` from step 1 (or the checkpoint ``--resume`` finds) to ``o.steps``: one global batch per
    step, checkpoints and records as the module docstring says. Returns {"losses", "step_s", "first_step",
    "steps", "data_parallel", "train_s"} for the steps this run took and, with ``o.min_accuracy`` in the chief,
    "averaged": ``spec.training.average_params`` of the weights at this run's last ``spec.demo.AVERAGE``
    checkpoint steps (every ``o.checkpoint_every`` steps and the last, written or not)."""
    first = resume(engine, o, framework) + 1 if o.resume else 1
    if first > 1 and engine.chief:
        log(f"{framework}: resumed from step {first - 1} ({o.checkpoint_dir})")
    losses, step_s = [], []
    kept = collections.deque(maxlen=demo.AVERAGE) if o.min_accuracy is not None and engine.chief else None
    for step in range(first, o.steps + 1):
        if o.kill_at == (step, _rank(engine)):
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.perf_counter()
        loss, grad = engine.step(global_batch(o.config, step, o.batch, o.seed), step in o.record_steps)
        step_s.append(time.perf_counter() - t0)
        losses.append(loss)
        if engine.chief and o.record and step in o.record_steps:
            _save(o.record / f"grad_{step}.safetensors", grad)
            _save(o.record / f"params_{step}.safetensors", engine.params())
        if step % o.checkpoint_every == 0 or step == o.steps:
            if o.checkpoint_dir:
                write_checkpoint(engine, o.checkpoint_dir, step, o, framework)
            if kept is not None:
                kept.append({k: np.array(v) for k, v in engine.params().items()})  # copies: torch's are views
    result = {"framework": framework, "data_parallel": o.data_parallel, "first_step": first, "steps": o.steps,
              "losses": losses, "step_s": step_s, "train_s": float(sum(step_s))}
    if engine.chief and o.record:
        (o.record / "losses.json").write_text(json.dumps(result, indent=1))
    if kept:
        result["averaged"] = training.average_params(kept)
    return result


# ----------------------------------------------------------------- internals

def _progress(step: int, o: Options, framework: str) -> dict[str, Any]:
    return {"step": step, "framework": framework, "data_parallel": o.data_parallel, "batch": o.batch,
            "seed": o.seed, "config": o.config.to_dict(), "train_config": dataclasses.asdict(o.train_config)}


def _rank(engine: Engine) -> int:
    """The engine's process rank (0 for a single process driving several devices)."""
    return int(getattr(engine, "rank", 0))


def _save(path: Path, tensors: dict[str, np.ndarray] | None) -> None:
    weights_io.write_safetensors(path, {k: np.ascontiguousarray(v, np.float32) for k, v in (tensors or {}).items()},
                                 {})
