"""Token ids into impl_jax: a host copy for ``spec.validate`` (``host_ids``; inside a caller's ``jax.jit``, a
stand-in of the tracer's shape), then an int32 array padded to a shape bucket (``device_ids``, ``spec.shapes``),
so that a stream of shapes compiles a bounded number of programs.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spec import shapes, validate
from spec.config import Config

Ids = Any  # token ids (B, L): a nested list, a NumPy array, a jax.Array, or a tracer inside the caller's jit


def host_ids(ids: Ids, config: Config, name: str = "src") -> np.ndarray:
    """Token ids as NumPy for ``spec.validate``: a host copy of concrete ids (ragged nested lists refused in the
    spec's words, naming ``name``); for a tracer (the caller's jit), a read-only stand-in of its shape and dtype
    holding a valid non-pad id, so the checks of rank, shape and dtype run and the value checks (id range,
    all-padding rows) pass."""
    if isinstance(ids, jax.core.Tracer):
        return np.broadcast_to(np.asarray(config.eos_id).astype(ids.dtype), ids.shape)
    return validate.host_ids(name, ids)


def device_ids(ids: Ids, batch: int, length: int, pad_id: int) -> jax.Array:
    """Validated ids (B, L) as int32 (batch, length), the new rows and positions ``pad_id`` (concrete ids padded
    on the host: no XLA program per shape). Padding leaves every real result as it was (up to the order of fp32
    sums): padded source keys are masked, padded target positions come after the real ones (causal), added rows
    attend uniformly over masked keys (finite) and are dropped."""
    if isinstance(ids, jax.core.Tracer):
        widths = ((0, batch - ids.shape[0]), (0, length - ids.shape[1]))
        return jnp.pad(ids.astype(jnp.int32), widths, constant_values=pad_id)
    return jnp.asarray(shapes.pad_ids(np.asarray(ids), batch, length, pad_id))
