"""XLA programs shared by the models of one config: the cache of ``tf.function(jit_compile=True)`` programs that
``impl_tf.model``, ``lm``, ``search``, ``sampling`` and ``train`` run, and the bucketed forward they share.

A program takes the model's weights as its first argument, so every model of a config runs it: traced once,
compiled by XLA once per concrete shape (logged at INFO on the ``"impl_tf"`` logger the first time), the
``PROGRAMS_KEPT`` used last held (docs/decisions-tf.md, "Programs shared by the models of one config").
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from impl_tf.inputs import device_ids, stateless_seed
from spec import shapes
from spec.recording import recording
from spec.schema import param_specs

IDS = tf.TensorSpec([None, None], tf.int32)
PROGRAMS_KEPT = 64  # programs held (``compiled``), least recently used dropped first: each holds its XLA executables
SEED = tf.TensorSpec([2], tf.int64)  # a dropout rng: a stateless seed, an argument of the program (not baked in)
logger = logging.getLogger("impl_tf")
_programs: collections.OrderedDict = collections.OrderedDict()  # (config, name) -> (tf.function, shapes compiled)


def model_fields(model: tf.Module) -> None:
    """What a model (``Transformer``, ``LanguageModel``) holds beside its layers: ``params``, {canonical name:
    tf.Variable} in ``spec.schema`` order (the shared embedding once); ``compiled``, the XLA programs it ran by
    name (``forward``, ``decode``, the searches', the training steps'), shared with the models of its config."""
    by_name = {v.name.removesuffix(":0"): v for v in model.variables}
    model.params = {s.name: by_name[s.name] for s in param_specs(model.config)}
    model.compiled = {}  # str name -> tf.function (str: tf.Module sorts the keys when it lists the variables)


def run_forward(model: tf.Module, forward: Callable, ids: list[np.ndarray], intermediates: bool, rng
                ) -> tf.Tensor | tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """A model's forward on validated ids, (src, tgt_in) or (tokens,), padded to buckets: ``forward(model, *ids,
    seed)`` compiled, its logits (and intermediates) sliced back to the real shapes."""
    c, seed = model.config, None if rng is None else stateless_seed(rng)
    B, lengths = ids[0].shape[0], [x.shape[1] for x in ids]
    size = (shapes.batch_bucket(B), *(shapes.length_bucket(n, c.max_len) for n in lengths))
    args = [device_ids(x, size[0], size[i + 1], c.pad_id) for i, x in enumerate(ids)] + [seed] * (rng is not None)

    def recorded(*args: tf.Tensor):
        # Records while tf.function traces this, into a dict of the trace's own: with ``intermediates`` the dict of
        # symbolic tensors is part of the traced function's output, so every later call returns their values. Its
        # flags are in the program's name, its seed an argument: one trace for every seed.
        with recording() as rec:
            logits = forward(model, *args)
        return (logits, rec) if intermediates else logits

    flags = (" with intermediates" if intermediates else "") + (" with dropout" if seed is not None else "")
    signature = [IDS] * len(ids) + [SEED] * (rng is not None)
    out = compiled(model, "forward" + flags, recorded, signature, size, dropout=rng is not None)(*args)
    if not intermediates:
        return out[:B, :lengths[-1]]
    want = shapes.intermediates(c, B, *[0, *lengths][-2:], dropout=seed is not None)  # name -> ((B, S|T..), dtype)
    return out[0][:B, :lengths[-1]], {name: x[:B, :want[name][0][1]] for name, x in out[1].items()}


def compiled(model: tf.Module, name: str, fn: Callable, signature: list | None, shape: tuple[int, ...], *,
             dropout: bool) -> Callable:
    """The program ``name`` of the model's config, bound to the model's weights: ``fn`` XLA-compiled at first use,
    traced once for ``signature``, or without one a program per ``shape``. Logs ``shape``, the concrete shape about
    to be dispatched, the first time: XLA compiles it then. ``dropout``: whether the program draws dropout (section
    5.4: a forward or loss given a seed, a training step).

    Programs are shared by every model of one config, as ``jax.jit``'s cache is: the weights are the program's first
    argument (``_on_weights``), so a new model of a known config neither traces nor compiles again; the
    ``PROGRAMS_KEPT`` programs used last are held. A program that draws no dropout is keyed by the config with
    ``dropout`` 0.0 (its trace never reads the rate), so it is shared by models that differ in dropout alone. A
    program with a signature takes the weights as tensors, one without (a training step's) as the variables it
    updates."""
    config = model.config if dropout else model.config.replace(dropout=0.0)
    key = (config, name if signature is not None else f"{name} {shape}")
    program, compiled_shapes = _programs.pop(key, (None, set()))
    if program is None:
        weights = [tf.TensorSpec(p.shape, p.dtype) for p in model.params.values()]
        program = tf.function(_on_weights, input_signature=None if signature is None else [weights, *signature],
                              jit_compile=True, autograph=False)
    _programs[key] = program, compiled_shapes                        # the most recently used last
    while len(_programs) > PROGRAMS_KEPT:
        _programs.popitem(last=False)
    model.compiled[key[1]] = program
    if shape not in compiled_shapes:
        compiled_shapes.add(shape)
        logger.info("impl_tf: compiling %s for shape %s", name, shape)
    return functools.partial(_call, program, model, fn)


class _Tracing(threading.local):
    """The model and function of the program call under way, which a trace reads (``_on_weights``): the cached
    programs themselves hold no model, so a model the caller drops is freed."""
    model: tf.Module | None = None
    fn: Callable | None = None


_tracing = _Tracing()


def _call(program: Callable, model: tf.Module, fn: Callable, *args):
    """``program(weights, *args)`` on ``model``'s weights, ``model`` and ``fn`` what a trace it triggers runs."""
    saved = _tracing.model, _tracing.fn
    _tracing.model, _tracing.fn = model, fn
    try:
        return program(list(model.params.values()), *args)
    finally:
        _tracing.model, _tracing.fn = saved


def _on_weights(weights: list, *args):
    """The traced body of every program: ``fn(*args)`` of the call's model (``_tracing``), weights in
    ``model.params`` order; the layers and ``params`` hold the arguments in place of the model's variables while it
    traces, so the trace captures no model's variables and runs any model of the config."""
    model, fn = _tracing.model, _tracing.fn
    held = dict(zip((id(v) for v in model.params.values()), weights, strict=True))
    slots = [(m, k, v) for m in (model, *model.submodules) for k, v in vars(m).items() if id(v) in held]
    params = model.params
    try:
        for m, k, v in slots:
            setattr(m, k, held[id(v)])
        model.params = dict(zip(params, weights, strict=True))
        return fn(*args)
    finally:
        for m, k, v in slots:
            setattr(m, k, v)
        model.params = params
