"""Where one workload's time and memory go: the breakdowns behind the causes that ``docs/decisions-*.md`` give,
for the subjects of ``bench.memory`` at its shapes.

    python -m bench.profile --framework torch --workload forward --subject ours --dtype bfloat16
    python -m bench.profile --framework torch --workload forward --subject peer --dtype bfloat16
    python -m bench.profile --framework jax --workload forward --subject peer --dtype float32

torch: ``torch.profiler`` over one run after a warm-up run: the operators with the most self CPU time (with
their input shapes), then those that allocate the most memory (``profile_memory``: bytes an operator allocated
itself, freed or not). jax, forward and train: the compiled program's ``memory_analysis`` in MiB (its arguments,
outputs, temporaries and the arguments it may overwrite, ``alias``). With ``XLA_FLAGS="--xla_dump_to=DIR
--xla_dump_hlo_as_text"`` XLA writes each program's buffer assignment (``*buffer-assignment.txt``): which values
the temporaries hold. ``AIAYN_TORCH_NATIVE_BF16=1`` as for ``bench.run``.
"""

from __future__ import annotations

import argparse
import importlib

import spec
from bench.common import bench_params, inputs, targets
from bench.memory import subject, subject_arguments


def profile_torch(args: argparse.Namespace, rows: int) -> str:
    """Two tables of one run after a warm-up: operators by self CPU time, then by memory allocated."""
    import torch

    fw = importlib.import_module("bench.bench_torch")
    fw.setup("cpu")
    torch.set_num_threads(args.threads)
    name, run = subject(args, fw)
    run()
    with torch.profiler.profile(record_shapes=True, profile_memory=True) as prof:
        run()
    by_shape = prof.key_averages(group_by_input_shape=True)
    return "\n".join([
        f"{name}, {args.workload}, {args.dtype}, B={args.batch}, {args.threads} threads",
        by_shape.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=28,
                       max_shapes_column_width=60),
        prof.key_averages().table(sort_by="self_cpu_memory_usage", row_limit=rows, max_name_column_width=28)])


def profile_jax(args: argparse.Namespace) -> str:
    """The workload's compiled program (forward or training step): its memory by kind, in MiB."""
    if args.workload not in ("forward", "train"):
        raise SystemExit(f"error: jax profiles the forward and the training step, got {args.workload}")
    fw = importlib.import_module("bench.bench_jax")
    fw.setup("cpu")
    name, lowered = (_jax_train if args.workload == "train" else _jax_forward)(args, fw)
    stats = lowered.compile().memory_analysis()
    kinds = ("argument", "output", "temp", "alias", "generated_code")
    mib = {k: getattr(stats, f"{k}_size_in_bytes") / 2**20 for k in kinds}
    sizes = ", ".join(f"{k} {v:.1f}" for k, v in mib.items())
    return f"{name}, {args.workload}, {args.dtype}, B={args.batch}: {sizes}"


def _jax_forward(args: argparse.Namespace, fw) -> tuple[str, object]:
    """(name, lowered forward): ours as ``model(src, tgt_in)`` under ``impl_jax.XLA_OPTIONS``, the peer's own jit."""
    import jax
    import jax.numpy as jnp

    import impl_jax

    config = spec.preset(args.config, dtype=args.dtype)
    src, tgt_in = (jnp.asarray(a, jnp.int32) for a in inputs(config, args.batch, args.src_len, args.tgt_len))
    if args.subject == "peer":
        peer = fw.peer(config, "cpu")
        return peer.name, peer.program.lower(peer.state, src, tgt_in)
    model = fw.ours(config, bench_params(config), "cpu").model
    forward = jax.jit(lambda m, s, t: m(s, t), compiler_options=impl_jax.XLA_OPTIONS)
    return "impl_jax", forward.lower(model, src, tgt_in)


def _jax_train(args: argparse.Namespace, fw) -> tuple[str, object]:
    """(name, lowered training step) at ``bench.memory``'s train subject (fp32 master weights): ours the program of
    the forward and backward ``impl_jax.train_step`` runs after its host checks
    (``impl_jax.train.loss_and_gradients_program``; its Adam step is a program of its own), the peer's own jit."""
    import jax
    import jax.numpy as jnp

    import impl_jax
    from impl_jax import train

    config = spec.preset(args.config, dtype=args.dtype, param_dtype="float32")
    src, tgt_in = inputs(config, args.batch, args.src_len, args.tgt_len)
    tgt_out = targets(config, tgt_in)  # (B, T)
    ids = tuple(jnp.asarray(a, jnp.int32) for a in (src, tgt_in, tgt_out))
    if args.subject == "peer":
        peer = fw.peer_trainer(config, "cpu")
        return peer.name, peer.program.lower(*peer.state, *ids)
    model = fw.ours(config, bench_params(config), "cpu").model
    smoothing = jnp.asarray(impl_jax.init_train_state(model).train_config.label_smoothing, jnp.float32)
    key = jax.random.key(0)  # the model draws dropout: the program train_step runs takes a key
    return "impl_jax", train.loss_and_gradients_program.lower(model, ids[:2], ids[2], smoothing, key)


def main(argv: list[str] | None = None) -> None:
    p = subject_arguments(argparse.ArgumentParser(description=__doc__,
                                                  formatter_class=argparse.RawDescriptionHelpFormatter))
    p.add_argument("--rows", type=int, default=15, help="operators per torch table")
    args = p.parse_args(argv)
    if args.framework == "tf":
        raise SystemExit("error: no tf profile here (TensorFlow's own profiler: tf.profiler.experimental)")
    print(profile_torch(args, args.rows) if args.framework == "torch" else profile_jax(args))


if __name__ == "__main__":
    main()
