"""Canonical safetensors weights <-> the JAX parameter pytree, through ``spec.weights_io``.

The pytree nests the canonical dotted names: ``"decoder.layers.1.cross_attn.w_q"``
is ``params["decoder"]["layers"][1]["cross_attn"]["w_q"]`` (numeric parts become
list indices). Arrays keep their stored dtype (bf16 natively), so a load and a
save round-trip bit for bit. Errors are the spec's ``ValueError``s.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from spec import weights_io
from spec.config import Config
from spec.init import init_params as _spec_init_params

Params = dict


def to_tree(flat: dict[str, np.ndarray]) -> Params:
    """Canonical ``{dotted name: array}`` -> nested dicts and lists of ``jax.Array``."""
    tree: dict = {}
    for name, array in flat.items():
        *path, leaf = name.split(".")
        node = tree
        for key in path:
            node = node.setdefault(key, {})
        node[leaf] = jnp.asarray(array)
    return _lists(tree)


def _lists(node):
    """Turn dicts keyed "0".."n-1" into lists (layer stacks)."""
    if not isinstance(node, dict):
        return node
    node = {k: _lists(v) for k, v in node.items()}
    if node and all(k.isdigit() for k in node):
        return [node[str(i)] for i in range(len(node))]
    return node


def to_flat(params: Params) -> dict[str, np.ndarray]:
    """The pytree as canonical ``{dotted name: numpy array}`` (bf16 as ``ml_dtypes.bfloat16``)."""
    leaves = jax.tree_util.tree_leaves_with_path(params)
    return {".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): np.asarray(x) for path, x in leaves}


def params_at(params: Params, prefix: str) -> Params:
    """The subtree under a canonical prefix, e.g. ``"decoder.layers.1.cross_attn"``; ``""`` is the whole tree."""
    node = params
    for key in filter(None, prefix.split(".")):
        node = node[int(key)] if isinstance(node, list) else node[key]
    return node


def load_weights(path: str | os.PathLike, config: Config | None = None) -> tuple[Config, Params]:
    """Read a canonical weights file (``spec.weights_io``) -> (config, parameter pytree of ``jax.Array``).

    Raises:
        ValueError: naming the file if truncated or corrupt, or the tensor that is
            missing, unexpected, of the wrong shape or dtype, or non-finite.
    """
    config, flat = weights_io.load_weights(path, config)
    return config, to_tree(flat)


def save_weights(params: Params, config: Config, path: str | os.PathLike) -> None:
    """Write the parameter pytree and ``config`` as a canonical safetensors file.

    Raises:
        ValueError: as ``spec.weights_io.check_params``.
    """
    weights_io.save_weights(path, config, to_flat(params))


def init_params(config: Config, seed: int) -> Params:
    """Freshly initialised parameters (``spec.init.init_params``, the paper's scheme) as a pytree."""
    return to_tree(_spec_init_params(config, seed))
