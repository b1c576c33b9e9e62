"""The encoder-decoder Transformer (Vaswani et al., 2017, section 3) as a tf.Module, with a preallocated KV cache,
and what the decoder-only ``impl_tf.lm.LanguageModel`` shares with it (``decode``).

The decoder has one code path, as in ``spec.reference``: it consumes n new target tokens against a ``KVCache`` of
everything before them; a teacher-forced forward is one call with all T tokens and an empty cache. The entry points
run as ``tf.function(jit_compile=True)`` programs with shape-polymorphic input signatures: traced once, compiled by
XLA once per concrete shape, and shared by the models of one config, whose weights they take as arguments.

So that varying shapes compile a bounded number of programs, the forward, ``encode``, the searches and the
training steps pad their inputs to buckets (``spec.shapes.batch_bucket``, ``length_bucket``; why the padding
changes no real result is written there) and slice the padding off their results. ``init_cache`` and ``decode``
are not padded: their capacity is the caller's choice. Each shape compiled for the first time logs one line at
INFO on the ``"impl_tf"`` logger.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from impl_tf.inputs import device_ids, host_ids, stateless_seed
from impl_tf.layers import DecoderLayer, Embedder, EncoderLayer, LayerNorm, dropout, write_kv
from spec import shapes, validate
from spec.annotations import Bool, Float, Int
from spec.config import Config
from spec.init import init_params
from spec.recording import record, recording, scope
from spec.schema import param_specs

IDS = tf.TensorSpec([None, None], tf.int32)
PROGRAMS_KEPT = 64  # programs held (``_compiled``), least recently used dropped first: each holds its XLA executables
SEED = tf.TensorSpec([2], tf.int64)  # a dropout rng: a stateless seed, an argument of the program (not baked in)
logger = logging.getLogger("impl_tf")
_programs: collections.OrderedDict = collections.OrderedDict()  # (config, name) -> (tf.function, shapes compiled)


class KVCache(NamedTuple):
    """Decoder state for incremental decoding (``spec.api.KV_CACHE_FIELDS``); fixed-shape, so it can live in a
    compiled ``tf.while_loop``; a nest of tensors. Self-attention keys/values are preallocated to a capacity P and
    written in place by ``decode``; cross-attention keys/values are computed once per source
    (``Transformer.init_cache``); a decoder-only model's ``memory_kv`` is () and ``memory_mask`` None."""

    self_kv: tuple[tuple[Float[tf.Tensor, "B H P K"], Float[tf.Tensor, "B H P C"]], ...]  # per decoder layer
    key_mask: Bool[tf.Tensor, "B P"]  # True = a written, non-pad target position
    memory_kv: tuple[tuple[Float[tf.Tensor, "B H S K"], Float[tf.Tensor, "B H S C"]], ...]  # per decoder layer
    memory_mask: Bool[tf.Tensor, "B S"] | None  # True = non-pad source position
    length: Int[tf.Tensor, ""]  # int32: positions written so far


def key_padding_mask(ids: tf.Tensor, pad_id: int) -> tf.Tensor:
    """ids (B, L) -> (B, L) bool, True at non-pad positions."""
    return ids != pad_id


def causal_mask(start: tf.Tensor, n: tf.Tensor, capacity: tf.Tensor) -> tf.Tensor:
    """(n, capacity) bool: the query at position start + i may attend keys 0..start + i (section 3.2.3)."""
    return tf.range(capacity)[None, :] <= (start + tf.range(n))[:, None]


class Stack(tf.Module):
    """``n`` layers of one kind under the canonical prefix ``name`` (section 3.1); pre-LN adds a final LayerNorm:
    what the encoder and decoder stacks share."""

    def __init__(self, config: Config, params: dict[str, np.ndarray], layer: type[tf.Module], name: str, n: int):
        super().__init__(name=name)
        self.layers = [layer(config, params, f"{name}.layers.{i}") for i in range(n)]
        self.final_norm = LayerNorm(config, params, f"{name}.final_norm") if config.norm_first else None


class Encoder(Stack):
    """N encoder layers (section 3.1); pre-LN adds a final LayerNorm."""

    def __init__(self, config: Config, params: dict[str, np.ndarray]):
        super().__init__(config, params, EncoderLayer, "encoder", config.n_encoder_layers)

    def forward(self, x: tf.Tensor, mask: tf.Tensor, rng: tf.Tensor | None = None) -> tf.Tensor:
        """x (B, S, D), key padding mask (B, 1, 1, S) -> memory (B, S, D); ``rng`` as ``layers.dropout``'s."""
        for i, layer in enumerate(self.layers):
            with scope(f"encoder.layers.{i}"):
                x = record("out", layer.forward(x, mask, rng))
        if self.final_norm is not None:
            x = self.final_norm.forward(x)
        return record("encoder.out", x)


class Decoder(Stack):
    """N decoder layers over a KV cache (section 3.1); pre-LN adds a final LayerNorm."""

    def __init__(self, config: Config, params: dict[str, np.ndarray]):
        super().__init__(config, params, DecoderLayer, "decoder", config.n_decoder_layers)

    def forward(self, y: tf.Tensor, cache: KVCache, rng: tf.Tensor | None = None) -> tuple[tf.Tensor, KVCache]:
        """y (B, n, D) at positions ``cache.length...``, whose keys are already in ``cache.key_mask`` -> (h (B, n, D),
        the cache with their keys/values written). Self-attention sees the cached positions and the new ones
        causally, minus padding keys; ``rng`` as ``layers.dropout``'s."""
        start, n, capacity = cache.length, tf.shape(y)[1], tf.shape(cache.key_mask)[1]
        self_mask = causal_mask(start, n, capacity)[None, None] & cache.key_mask[:, None, None, :]  # (B, 1, n, P)
        memory_mask = None if cache.memory_mask is None else cache.memory_mask[:, None, None, :]  # (B, 1, 1, S)
        self_kv = []
        for i, layer in enumerate(self.layers):
            with scope(f"decoder.layers.{i}"):
                memory_kv = cache.memory_kv[i] if cache.memory_kv else None                      # decoder-only: none
                y, kv = layer.forward(y, cache.self_kv[i], self_mask, memory_kv, memory_mask, start, rng)
                record("out", y)
            self_kv.append(kv)
        if self.final_norm is not None:
            y = self.final_norm.forward(y)
        return record("decoder.out", y), cache._replace(self_kv=tuple(self_kv), length=start + n)


class Transformer(tf.Module):
    """The Transformer of "Attention Is All You Need" (section 3), holding ``spec.init_params(config, seed)``.

    Its entry points compute in evaluation mode (no dropout) unless the forward is given a dropout ``rng`` (section
    5.4), as ``impl_tf.train_step`` gives it one each step. ``params``: canonical parameters that
    ``spec.weights_io.check_params`` accepted for ``config``, held instead of ``init_params``'s
    (``impl_tf.from_params``, ``load_weights``). Fields: ``config``; the layers; those of ``_model_fields``.

    Raises:
        ValueError: from ``spec.validate.check_model_kind`` for a decoder-only config, or ``spec.init_params``.
    """

    def __init__(self, config: Config, seed: int = 0, *, params: dict[str, np.ndarray] | None = None):
        validate.check_model_kind(config, decoder_only=False)
        super().__init__(name="transformer")
        params = init_params(config, seed) if params is None else params
        self.config = config
        self.embedder = Embedder(config, params)
        self.encoder = Encoder(config, params)
        self.decoder = Decoder(config, params)
        _model_fields(self)

    def forward(self, src, tgt_in, intermediates: bool = False, *, rng=None
                ) -> Float[tf.Tensor, "B T V"] | tuple[Float[tf.Tensor, "B T V"], dict[str, tf.Tensor]]:
        """Teacher-forced forward (section 3), as ``spec.api``; token ids may be nested lists, NumPy arrays or
        tensors. Runs padded to buckets (module docstring), so the masks a seed draws for the real positions depend
        on the buckets too. ``rng``: dropout (section 5.4, ``layers.dropout``) from a stateless seed, (2,) int (a
        list, array or tensor, e.g. ``[seed, 0]``), else ``ValueError``; None, the default, evaluates."""
        src, tgt_in = host_ids(src), host_ids(tgt_in, "tgt_in")
        validate.check_forward(src, tgt_in, self.config)
        return _run_forward(self, _forward, [src, tgt_in], intermediates, rng)

    __call__ = forward

    def encode(self, src) -> Float[tf.Tensor, "B S D"]:
        """Encoder stack (section 3.1): src (B, S) int -> memory (B, S, D); runs padded to buckets."""
        src, c = host_ids(src), self.config
        validate.check_source(src, c)
        (B, S), size = src.shape, (shapes.batch_bucket(src.shape[0]), shapes.length_bucket(src.shape[1], c.max_len))
        encode = _compiled(self, "encode", lambda src: _encode(self, src), [IDS], size)
        return encode(device_ids(src, *size, c.pad_id))[:B, :S]

    def init_cache(self, memory: Float[tf.Tensor, "B S D"], src, capacity: int) -> KVCache:
        """An empty ``KVCache`` for ``capacity`` target positions (P); the cross-attention K/V of memory (B, S, D)
        are computed once here (section 3.2.3). Raises ``ValueError`` as ``spec.api``, or for memory not (B, S, D).
        """
        src = host_ids(src)
        validate.check_source(src, self.config)
        validate.check_capacity(capacity, self.config)
        if tuple(memory.shape) != (*src.shape, self.config.d_model):
            raise ValueError(f"memory shape {tuple(memory.shape)} does not match src shape {src.shape} "
                             f"and d_model {self.config.d_model}")
        return _init_cache(self, tf.convert_to_tensor(memory), device_ids(src, *src.shape, self.config.pad_id),
                           int(capacity))

    def decode(self, tokens, cache: KVCache) -> tuple[Float[tf.Tensor, "B n V"], KVCache]:
        """n new target tokens (B, n) int at positions ``cache.length``.. -> (logits (B, n, V) float32, cache).
        Projections and FFN run on the new tokens only; attention reads the cache (section 3.2.3)."""
        return decode(self, tokens, cache)


def decode(model: tf.Module, tokens, cache: KVCache) -> tuple[tf.Tensor, KVCache]:
    """The ``decode`` of either model (``Transformer``, ``impl_tf.lm.LanguageModel``): validated, then one program,
    which takes the cache's tensors, a decoder-only model's without memory (a signature holds no None)."""
    tokens, c = host_ids(tokens, "tokens"), model.config
    B, capacity = cache.key_mask.shape
    validate.check_decode(tokens, c, B, int(cache.length), capacity)
    kv = ((tf.TensorSpec([None, c.n_heads, None, c.d_k], model.embedder.dtype),
           tf.TensorSpec([None, c.n_heads, None, c.d_v], model.embedder.dtype)),) * c.n_decoder_layers
    mask, length = tf.TensorSpec([None, None], tf.bool), tf.TensorSpec([], tf.int32)
    memory = () if c.decoder_only else (cache.memory_kv, cache.memory_mask)

    def step(tokens: tf.Tensor, self_kv: tuple, key_mask: tf.Tensor, length: tf.Tensor, memory: tuple):
        return _decode(model, tokens, KVCache(self_kv, key_mask, *(memory or ((), None)), length))

    shape = (B, tokens.shape[1], capacity, *(m.shape[1] for m in memory[1:]))
    program = _compiled(model, "decode", step, [IDS, kv, mask, length, (kv, mask)[:len(memory)]], shape)
    return program(device_ids(tokens, *tokens.shape, c.pad_id), cache.self_kv, cache.key_mask, cache.length, memory)


# ----------------------------------------------------------------- traced computations and their programs

def _encode(model: Transformer, src: tf.Tensor, rng: tf.Tensor | None = None) -> tf.Tensor:
    """src (B, S) int32 -> memory (B, S, D): embedding and encoder (sections 3.1-3.5); ``rng`` as dropout's."""
    x = dropout(model.embedder.encode(src), "src_embed", model.config.dropout, rng)              # (B, S, D)
    return model.encoder.forward(x, key_padding_mask(src, model.config.pad_id)[:, None, None, :], rng)


def _empty_cache(model: tf.Module, batch: int | tf.Tensor, capacity: int | tf.Tensor) -> KVCache:
    """An empty cache of ``capacity`` positions for ``batch`` rows, without memory: a decoder-only model's."""
    c, zeros = model.config, lambda d: tf.zeros([batch, model.config.n_heads, capacity, d], model.embedder.dtype)
    return KVCache(self_kv=tuple((zeros(c.d_k), zeros(c.d_v)) for _ in model.decoder.layers),
                   key_mask=tf.zeros([batch, capacity], tf.bool), memory_kv=(), memory_mask=None,
                   length=tf.constant(0, tf.int32))


def _init_cache(model: Transformer, memory: tf.Tensor, src: tf.Tensor, capacity: int | tf.Tensor) -> KVCache:
    """An empty cache of ``capacity`` target positions for memory (B, S, D) of source src (B, S) int32."""
    return _empty_cache(model, tf.shape(memory)[0], capacity)._replace(
        memory_kv=tuple(layer.cross_attn.project_kv(memory) for layer in model.decoder.layers),
        memory_mask=key_padding_mask(src, model.config.pad_id))


def _decode(model: tf.Module, tokens: tf.Tensor, cache: KVCache, rng: tf.Tensor | None = None, *,
            at: tf.Tensor | None = None) -> tuple[tf.Tensor, KVCache]:
    """tokens (B, n) int32 at positions ``cache.length...`` -> (logits (B, n, V) float32, or (B, 1, V) of new
    position ``at`` alone, the updated cache): embedding, decoder, tied output projection; ``rng`` as dropout's."""
    key_mask = write_kv(cache.key_mask, key_padding_mask(tokens, model.config.pad_id), cache.length)  # (B, P)
    y = dropout(model.embedder.encode(tokens, cache.length), "tgt_embed", model.config.dropout, rng)  # (B, n, D)
    h, cache = model.decoder.forward(y, cache._replace(key_mask=key_mask), rng)                      # (B, n, D)
    h = h if at is None else tf.gather(h, [at], axis=1)  # a prefill needs its last position only
    return record("logits", model.embedder.decode(h)), cache


def _forward(model: Transformer, src: tf.Tensor, tgt_in: tf.Tensor, rng: tf.Tensor | None = None) -> tf.Tensor:
    """src (B, S), tgt_in (B, T) int32 -> logits (B, T, V) float32: the decoder's one code path over an empty
    cache of capacity T; ``rng`` as ``layers.dropout``'s."""
    memory = _encode(model, src, rng)                                                             # (B, S, D)
    return _decode(model, tgt_in, _init_cache(model, memory, src, tf.shape(tgt_in)[1]), rng)[0]


def _model_fields(model: tf.Module) -> None:
    """What a model (``Transformer``, ``LanguageModel``) holds beside its layers: ``params``, {canonical name:
    tf.Variable} in ``spec.schema`` order (the shared embedding once); ``compiled``, the XLA programs it ran by
    name (``forward``, ``decode``, the searches', the training steps'), shared with the models of its config."""
    by_name = {v.name.removesuffix(":0"): v for v in model.variables}
    model.params = {s.name: by_name[s.name] for s in param_specs(model.config)}
    model.compiled = {}  # str name -> tf.function (str: tf.Module sorts the keys when it lists the variables)


def _run_forward(model: tf.Module, forward: Callable, ids: list[np.ndarray], intermediates: bool, rng
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
    out = _compiled(model, "forward" + flags, recorded, [IDS] * len(ids) + [SEED] * (rng is not None), size)(*args)
    if not intermediates:
        return out[:B, :lengths[-1]]
    want = shapes.intermediates(c, B, *[0, *lengths][-2:], dropout=seed is not None)  # name -> ((B, S|T..), dtype)
    return out[0][:B, :lengths[-1]], {name: x[:B, :want[name][0][1]] for name, x in out[1].items()}


def _compiled(model: tf.Module, name: str, fn: Callable, signature: list | None, shape: tuple[int, ...]
              ) -> Callable:
    """The program ``name`` of the model's config, bound to the model's weights: ``fn`` XLA-compiled at first use,
    traced once for ``signature``, or without one a program per ``shape``. Logs ``shape``, the concrete shape about
    to be dispatched, the first time: XLA compiles it then.

    Programs are shared by every model of one config, as ``jax.jit``'s cache is: the weights are the program's first
    argument (``_on_weights``), so a new model of a known config neither traces nor compiles again; the
    ``PROGRAMS_KEPT`` programs used last are held. A program with a signature takes the weights as tensors, one
    without (a training step's) as the variables it updates."""
    key = (model.config, name if signature is not None else f"{name} {shape}")
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
