"""Importing impl_tf loads TensorFlow and the spec, and none of the other frameworks; it is a typed package
of version 0.2.0 that sets no process-wide state."""

import subprocess
import sys
from pathlib import Path


def test_import_loads_no_other_framework():
    others = ("torch", "jax", "jaxlib", "flax", "impl_torch", "impl_jax")
    code = ("import sys, impl_tf; "
            f"print(sorted(m for m in {others!r} if m in sys.modules)); "
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]", f"importing impl_tf loaded {out[0]}"
    assert out[1] == "True"


def test_version_and_typed_marker():
    import impl_tf

    assert impl_tf.__version__ == "0.2.0"
    assert (Path(impl_tf.__file__).parent / "py.typed").is_file()


def test_import_and_use_change_no_global_state():
    """Importing impl_tf, building a model and running it set no TensorFlow flag and add no logging handler."""
    code = ("import logging, tensorflow as tf; "
            "from tensorflow.python.framework.config import is_op_determinism_enabled; "  # no public getter
            "flags = lambda: (tf.config.experimental.tensor_float_32_execution_enabled(), "
            "is_op_determinism_enabled(), tf.config.get_soft_device_placement(), "
            "tf.config.functions_run_eagerly()); "
            "before = flags(); import impl_tf, spec; "
            "m = impl_tf.Transformer(spec.preset('tiny')); impl_tf.greedy_search(m, [[5, 2]], 2); "
            "print(before == flags(), logging.getLogger('impl_tf').handlers, logging.getLogger().handlers)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "True [] []"


def test_type_hints_resolve_without_optional_extras():
    """The shape annotations (``spec.annotations``) resolve at run time, with or without jaxtyping installed."""
    import typing

    import impl_tf

    for f in (impl_tf.greedy_search, impl_tf.beam_search, impl_tf.train_step, impl_tf.load_weights,
              impl_tf.Transformer.forward, impl_tf.Transformer.encode, impl_tf.Transformer.init_cache,
              impl_tf.Transformer.decode):
        typing.get_type_hints(f)
