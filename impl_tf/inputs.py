"""Token ids and seeds into impl_tf: a host copy of the ids for ``spec.validate`` (``host_ids``), then an int32
tensor padded to a shape bucket (``device_ids``, ``spec.shapes``), so that a stream of shapes compiles a bounded
number of programs; a dropout ``rng`` as the stateless seed the programs take (``stateless_seed``).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from spec import shapes, validate


def host_ids(ids, name: str = "src") -> np.ndarray:
    """Token ids (nested lists, NumPy arrays or eager tensors) as a NumPy host copy for ``spec.validate``, named."""
    return validate.host_ids(name, ids)


def device_ids(ids: np.ndarray, batch: int, length: int, pad_id: int) -> tf.Tensor:
    """Validated ids (B, L) as int32 (batch, length): a bucket (module docstring), added rows and positions pad."""
    return tf.constant(shapes.pad_ids(ids, batch, length, pad_id))


def stateless_seed(rng) -> tf.Tensor:
    """A dropout ``rng`` as the programs take it, (2,) int64; a ``ValueError`` if it is not two integers."""
    seed = tf.convert_to_tensor(rng)
    if not seed.dtype.is_integer or seed.shape != (2,):
        raise ValueError(f"rng must be a stateless seed, (2,) int, got {seed.dtype.name}{tuple(seed.shape)}")
    return tf.cast(seed, tf.int64)
