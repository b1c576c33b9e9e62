"""The encoder-decoder Transformer (Vaswani et al., 2017, section 3): a pytree model over pure, jitted functions.

``Transformer`` is the public model, in the Equinox style: a pytree whose
children are the parameters and whose static aux data is the frozen
``spec.config.Config``, so it passes through ``jax.jit``, ``jax.tree.map`` and
``jax.device_put`` like any pytree and its methods are pure. It holds nothing
else, and unflattening never re-initialises.

Below it is the functional layer the methods call, for those who want it:
``forward(params, config, src, tgt_in)``, ``encode``, ``init_cache`` and
``decode`` of a parameter pytree (nested dicts keyed by the canonical names of
``spec.schema``: ``params["decoder"]["layers"][1]["cross_attn"]["w_q"]`` is
``decoder.layers.1.cross_attn.w_q``; see ``to_tree``). The config is a static
argument of every jitted function: ``Config`` is frozen and hashable.

Compilation is bounded: ``forward`` and ``encode`` pad the batch to the next
power of two and the lengths to buckets (``spec.shapes.length_bucket``), so a stream of
varying shapes compiles a few programs, not one per shape. Each new
compilation logs one line at INFO on the ``"impl_jax"`` logger.

Every public function validates its inputs on host copies with ``spec.validate``
before anything is converted, traced or computed, so bad input raises the
spec's ``ValueError`` and never reaches JAX's clamping gathers. Inside the
caller's own ``jax.jit`` token ids are tracers: then the checks that need only
shapes and dtypes run, and the value checks are skipped (``host_ids``).
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from impl_jax import layers
from spec import shapes, validate
from spec.config import Config
from spec.init import init_params
from spec.recording import record, recording, scope

Params = dict
Ids = Any  # token ids (B, L): a nested list, a NumPy array, a jax.Array, or a tracer inside the caller's jit

log = logging.getLogger("impl_jax")

if TYPE_CHECKING:  # shape hints for readers and type checkers (jaxtyping); nothing of it is imported at run time
    from jaxtyping import Bool, Float, Int


class KVCache(NamedTuple):
    """Decoder state for incremental decoding, preallocated to a fixed capacity P (a pytree).

    self_kv: per decoder layer, self-attention k (B, H, P, K) and v (B, H, P, C);
        positions ``length ..`` are not written yet.
    key_mask: (B, P) bool, True where a key is written and is not padding.
    memory_kv: per decoder layer, cross-attention k (B, H, S, K) and v (B, H, S, C)
        of the encoder output, computed once per source.
    memory_mask: (B, S) bool, True where the source token is not padding.
    length: () int32, the number of positions written.
    """
    self_kv: tuple[tuple[Float[jax.Array, "B H P K"], Float[jax.Array, "B H P C"]], ...]
    key_mask: Bool[jax.Array, "B P"]
    memory_kv: tuple[tuple[Float[jax.Array, "B H S K"], Float[jax.Array, "B H S C"]], ...]
    memory_mask: Bool[jax.Array, "B S"]
    length: Int[jax.Array, ""]

    @property
    def capacity(self) -> int:
        return self.key_mask.shape[1]


# ----------------------------------------------------------------- the parameter pytree

def to_tree(flat: dict[str, np.ndarray]) -> Params:
    """Canonical ``{dotted name: array}`` -> nested dicts (lists for layer stacks) of ``jax.Array``, dtypes kept."""
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


def params_at(params: Params, name: str) -> Any:
    """The subtree or leaf under a canonical name, e.g. ``"decoder.layers.1.cross_attn"``; ``""`` is the tree."""
    node = params
    for key in filter(None, name.split(".")):
        node = node[int(key)] if isinstance(node, list) else node[key]
    return node


# ----------------------------------------------------------------- input checks and shape buckets

def host_ids(ids: Ids, config: Config) -> np.ndarray:
    """Token ids as NumPy for ``spec.validate``: a host copy of concrete ids.

    A tracer (the ids inside the caller's ``jax.jit``) has no values: it becomes a
    read-only stand-in of its shape and dtype that holds a valid non-pad id
    (``eos_id``), so the checks of rank, shape and integer dtype run and the value
    checks (id range, all-padding rows) pass.
    """
    if isinstance(ids, jax.core.Tracer):
        return np.broadcast_to(np.asarray(config.eos_id).astype(ids.dtype), ids.shape)
    return np.asarray(ids)


def device_ids(ids: Ids, host: np.ndarray) -> jax.Array:
    """Validated ids as int32: the caller's tracer as it is, else the host copy ``spec.validate`` checked."""
    return jnp.asarray(ids if isinstance(ids, jax.core.Tracer) else host, jnp.int32)


def padded_ids(ids: Ids, host: np.ndarray, batch: int, length: int, pad_id: int) -> jax.Array:
    """Validated ids (B, L) as int32 (batch, length), the new rows and positions ``pad_id``.

    The padding leaves every real result as it was (up to the order of fp32 sums):
    padded source keys are masked (exactly zero weight), padded target positions
    come after the real ones (the causal mask hides them from those), and added
    rows, all padding, attend uniformly over masked keys (finite) and are dropped.
    Concrete ids are padded on the host (no XLA program per shape).
    """
    if isinstance(ids, jax.core.Tracer):
        widths = ((0, batch - host.shape[0]), (0, length - host.shape[1]))
        return jnp.pad(ids.astype(jnp.int32), widths, constant_values=pad_id)
    return jnp.asarray(shapes.pad_ids(host, batch, length, pad_id))


# ----------------------------------------------------------------- traceable stacks
# For use inside your own jax.jit (as generate.py does): inputs are assumed valid,
# parameters already in config.dtype (cast_params). The public functions below validate.

def cast_params(params: Params, config: Config) -> Params:
    """Parameters in the activation dtype (a no-op when ``param_dtype == dtype``)."""
    return jax.tree.map(lambda p: p.astype(config.dtype), params)


def _causal_mask(start: jax.Array | int, n: int, capacity: int) -> jax.Array:
    """(1, 1, n, P) bool: the query at position start+i may attend key j <= start+i."""
    q_pos = start + jnp.arange(n)[:, None]                 # (n, 1)
    return (jnp.arange(capacity)[None, :] <= q_pos)[None, None]


def encoder_stack(params: Params, src: jax.Array, config: Config, key: jax.Array | None = None) -> jax.Array:
    """Encoder (section 3.1): src (B, S) int -> memory (B, S, D); key padding from ``pad_id``; dropout with a
    ``key`` (training)."""
    mask = (src != config.pad_id)[:, None, None, :]                               # (B, 1, 1, S) key padding
    enc = params["encoder"]
    keys = layers.split(key, 1 + len(enc["layers"]))
    x = layers.dropout(layers.embedding(params["embedding"], src, config), config.dropout, keys[0])
    x = record("src_embed", x)                                                     # (B, S, D)
    for i, p in enumerate(enc["layers"]):
        with scope(f"encoder.layers.{i}"):
            x = record("out", layers.encoder_layer(p, x, mask, config, keys[1 + i]))
    if config.norm_first:
        x = layers.layer_norm(enc["final_norm"], x, config.layer_norm_eps)
    return record("encoder.out", x)


def cache_dtype(dtype: jnp.dtype) -> jnp.dtype:
    """The dtype a KV cache holds keys/values of activation ``dtype`` in: fp32 for bf16 on the CPU (the same
    values, exact), else ``dtype``. XLA's CPU backend has no bf16 x bf16 -> fp32 batched dot, so it converted
    the whole bf16 cache to fp32 at every decoding step (profiled at base size, B = 32: 1.4 ms per cached
    tensor, two thirds of the step)."""
    return jnp.dtype(jnp.float32) if jnp.dtype(dtype) == jnp.bfloat16 and jax.default_backend() == "cpu" else dtype


def empty_cache(params: Params, memory: jax.Array, src: jax.Array, capacity: int, config: Config) -> KVCache:
    """A ``KVCache`` of static ``capacity`` with the cross-attention K/V of ``memory`` (B, S, D), held in
    ``cache_dtype``."""
    B, H, dt = memory.shape[0], config.n_heads, cache_dtype(memory.dtype)
    empty = (jnp.zeros((B, H, capacity, config.d_k), dt), jnp.zeros((B, H, capacity, config.d_v), dt))
    memory_kv = tuple(tuple(t.astype(dt) for t in layers.attention_kv(p["cross_attn"], memory))
                      for p in params["decoder"]["layers"])
    return KVCache(tuple(empty for _ in memory_kv), jnp.zeros((B, capacity), bool), memory_kv,
                   src != config.pad_id, jnp.zeros((), jnp.int32))


def output_logits(params: Params, h: jax.Array) -> jax.Array:
    """Tied output projection h E^T (section 3.4): h (B, n, D) -> logits (B, n, V) float32, never rounded."""
    return layers.einsum_f32("bnd,vd->bnv", h, params["embedding"])


def decoder_stack(params: Params, tokens: jax.Array, cache: KVCache, config: Config, key: jax.Array | None = None
                  ) -> tuple[jax.Array, KVCache]:
    """Decoder over tokens (B, n) at positions ``cache.length ..`` -> (logits (B, n, V) fp32, updated cache);
    dropout with a ``key`` (training)."""
    start, n = cache.length, tokens.shape[1]
    key_mask = jax.lax.dynamic_update_slice_in_dim(cache.key_mask, tokens != config.pad_id, start, axis=1)
    self_mask = _causal_mask(start, n, cache.capacity) & key_mask[:, None, None, :]   # (B, 1, n, P)
    memory_mask = cache.memory_mask[:, None, None, :]                                # (B, 1, 1, S)
    dec, self_kv = params["decoder"], []
    keys = layers.split(key, 1 + len(dec["layers"]))
    y = layers.dropout(layers.embedding(params["embedding"], tokens, config, start), config.dropout, keys[0])
    y = record("tgt_embed", y)                                                       # (B, n, D)
    for i, p in enumerate(dec["layers"]):
        with scope(f"decoder.layers.{i}"):
            y, kv = layers.decoder_layer(p, y, cache.self_kv[i], cache.memory_kv[i], self_mask, memory_mask,
                                         start, config, keys[1 + i])
            record("out", y)
        self_kv.append(kv)
    if config.norm_first:
        y = layers.layer_norm(dec["final_norm"], y, config.layer_norm_eps)
    logits = record("logits", output_logits(params, record("decoder.out", y)))
    return logits, KVCache(tuple(self_kv), key_mask, cache.memory_kv, cache.memory_mask, start + n)


def teacher_forced(params: Params, src: jax.Array, tgt_in: jax.Array, config: Config, key: jax.Array | None = None
                   ) -> jax.Array:
    """Encoder and decoder stacks, teacher-forced (section 3): src (B, S), tgt_in (B, T) int32, valid ->
    logits (B, T, V) float32. Dropout with a ``key`` (training, ``impl_jax.train``), none without (evaluation).
    The one forward of ``forward`` and of training."""
    encoder_key, decoder_key = layers.split(key, 2)
    memory = encoder_stack(params, src, config, encoder_key)                        # (B, S, D)
    cache = empty_cache(params, memory, src, tgt_in.shape[1], config)  # capacity T: one code path with decode
    return decoder_stack(params, tgt_in, cache, config, decoder_key)[0]             # (B, T, V)


# Python in a jitted function runs once per trace, that is once per new compilation: the log line goes there.

@functools.partial(layers.jit, static_argnames=("config", "intermediates", "rounded"))
def _forward(params: Params, src: jax.Array, tgt_in: jax.Array, config: Config, intermediates: bool,
             rounded: bool = False):
    log.info("impl_jax: compiling forward for batch %d, source length %d, target length %d (buckets)%s",
             src.shape[0], src.shape[1], tgt_in.shape[1], ", with intermediates" if intermediates else "")
    if not rounded:  # else they are ``weights_f32(params, config)`` already, computed once by the caller
        params = weights_f32(params, config)
    # Recording runs here, at trace time, into this trace's own dict, with or without intermediates: a
    # caller's open ``recording`` never catches these tracers (which would leak, and only on the first trace).
    with recording() as rec:
        logits = teacher_forced(params, src, tgt_in, config)
    return logits, rec if intermediates else {}


@functools.partial(layers.jit, static_argnames=("config", "rounded"))
def _encode_jit(params: Params, src: jax.Array, config: Config, rounded: bool = False) -> jax.Array:
    log.info("impl_jax: compiling encode for batch %d, source length %d (buckets)", *src.shape)
    return encoder_stack(params if rounded else weights_f32(params, config), src, config)


@functools.partial(layers.jit, static_argnames=("config", "capacity"))
def _init_cache_jit(params: Params, memory: jax.Array, src: jax.Array, config: Config, capacity: int) -> KVCache:
    log.info("impl_jax: compiling init_cache for batch %d, source length %d, capacity %d", *src.shape, capacity)
    return empty_cache(cast_params(params, config), memory, src, capacity, config)


@functools.partial(layers.jit, static_argnames=("config",))
def _decode_jit(params: Params, tokens: jax.Array, cache: KVCache, config: Config) -> tuple[jax.Array, KVCache]:
    log.info("impl_jax: compiling decode for batch %d, %d new tokens, source length %d, capacity %d",
             *tokens.shape, cache.memory_mask.shape[1], cache.capacity)
    return decoder_stack(cast_params(params, config), tokens, cache, config)


# ----------------------------------------------------------------- the functional API

def encode(params: Params, config: Config, src: Ids) -> jax.Array:
    """Encoder stack (section 3.1): src (B, S) int token ids -> memory (B, S, D) in ``config.dtype``.

    Runs on the batch and length buckets (``padded_ids``); the padding is sliced off.

    Raises:
        ValueError: from ``spec.validate.check_source``.
    """
    return _checked_encode(params, config, src, False)


def _checked_encode(params: Params, config: Config, src: Ids, rounded: bool) -> jax.Array:
    """``encode``; with ``rounded``, ``params`` are ``weights_f32(params, config)`` already (same results)."""
    host = host_ids(src, config)
    validate.check_source(host, config)
    B, S = host.shape
    src = padded_ids(src, host, shapes.batch_bucket(B), shapes.length_bucket(S, config.max_len), config.pad_id)
    return _encode_jit(params, src, config, rounded)[:B, :S]


def init_cache(params: Params, config: Config, memory: jax.Array, src: Ids, capacity: int) -> KVCache:
    """An empty ``KVCache`` for ``memory`` (B, S, D) of ``src`` (B, S), holding up to ``capacity`` positions.

    Not bucketed: the cache has exactly the capacity asked for.

    Raises:
        ValueError: from ``spec.validate.check_source``, or if ``capacity`` is not
            an int in [1, config.max_len] (``check_capacity``) or ``memory`` does not match ``src``.
    """
    host = host_ids(src, config)
    validate.check_source(host, config)
    validate.check_capacity(capacity, config)
    if tuple(memory.shape) != (*host.shape, config.d_model):
        raise ValueError(f"memory shape {tuple(memory.shape)} does not match src {host.shape} and d_model")
    return _init_cache_jit(params, memory, device_ids(src, host), config, int(capacity))


def decode(params: Params, config: Config, tokens: Ids, cache: KVCache) -> tuple[jax.Array, KVCache]:
    """Decoder stack over n new tokens at positions ``cache.length ..`` (section 3.1).

    tokens (B, n) int -> (logits (B, n, V) float32, the updated cache). The
    self-attention sees the cached positions and the new ones causally, minus
    padding keys; cross-attention uses the cache's precomputed K/V. A new cache is
    returned; go on with it (the spec's rule: the cache passed in is consumed).

    Raises:
        ValueError: from ``spec.validate.check_decode``: bad ids, a batch that differs
            from the cache's, or tokens that do not fit in the cache's capacity (inside
            the caller's jit, where ``cache.length`` is traced, as if the cache were empty).
    """
    host = host_ids(tokens, config)
    length = 0 if isinstance(cache.length, jax.core.Tracer) else int(cache.length)
    validate.check_decode(host, config, cache.key_mask.shape[0], length, cache.capacity)
    return _decode_jit(params, device_ids(tokens, host), cache, config)


def forward(params: Params, config: Config, src: Ids, tgt_in: Ids, intermediates: bool = False):
    """Teacher-forced forward (section 3): src (B, S), tgt_in (B, T) int -> logits (B, T, V) float32.

    With ``intermediates=True`` returns ``(logits, {name: tensor})`` with the
    tensors of ``spec.shapes.intermediates`` (activations in ``config.dtype``).
    Padding keys are masked in every attention; the decoder's self-attention is
    causal (section 3.2.3). Runs on the batch and length buckets (``padded_ids``);
    the padding is sliced off every result.

    Raises:
        ValueError: from ``spec.validate.check_forward``.
    """
    return _checked_forward(params, config, src, tgt_in, intermediates, False)


def _checked_forward(params: Params, config: Config, src: Ids, tgt_in: Ids, intermediates: bool, rounded: bool):
    """``forward``; with ``rounded``, ``params`` are ``weights_f32(params, config)`` already (same results)."""
    src_host, tgt_host = host_ids(src, config), host_ids(tgt_in, config)
    validate.check_forward(src_host, tgt_host, config)
    (B, S), T = src_host.shape, tgt_host.shape[1]
    Bb = shapes.batch_bucket(B)
    src = padded_ids(src, src_host, Bb, shapes.length_bucket(S, config.max_len), config.pad_id)
    tgt_in = padded_ids(tgt_in, tgt_host, Bb, shapes.length_bucket(T, config.max_len), config.pad_id)
    logits, rec = _forward(params, src, tgt_in, config, bool(intermediates), rounded)
    if not intermediates:
        return logits[:B, :T]
    want = shapes.intermediates(config, B, S, T)  # name -> ((B, S or T, ...), dtype)
    return logits[:B, :T], {name: x[:B, :want[name][0][1]] for name, x in rec.items()}


def weights_f32(params: Params, config: Config) -> Params:
    """The parameters rounded to ``config.dtype`` (rule 0) and held in fp32: exact, as bf16 -> fp32 is exact.

    A bf16-mode forward on these computes what it computes on the bf16 weights, bit for bit: every product
    upcasts its bf16 activation and runs in fp32 (``layers.einsum_f32``), a product of bf16 values being exact
    in fp32, and biases and norm parameters enter fp32 arithmetic either way. What it saves is the conversion
    of every weight matrix on every call, which costs a bf16 forward more than its products gain from bf16 on
    a CPU (the bench report, ``nox -s bench``).
    """
    return jax.tree.map(lambda p: p.astype(config.dtype).astype(jnp.float32), params)


# ----------------------------------------------------------------- the model

@jax.tree_util.register_pytree_node_class
class Transformer:
    """The Transformer of section 3 as a pytree: ``params`` (children) and ``config`` (static aux data).

    ``Transformer(config, seed=0)`` holds ``spec.init_params(config, seed)``, the
    same bits as every other backend's; ``impl_jax.from_params`` and
    ``impl_jax.load_weights`` build one from given weights. Parameters keep their
    stored dtype (``config.param_dtype``) and are cast to ``config.dtype`` where
    they are read. The model has no mode: its methods evaluate (no dropout);
    ``impl_jax.train_step`` trains, with dropout from its state's key.

    The methods validate their input (the spec's ``ValueError``), then call the
    functional layer of this module; they work inside the caller's ``jax.jit``::

        logits = jax.jit(lambda m, s, t: m(s, t))(model, src, tgt_in)

    Attributes:
        config: the ``spec.config.Config`` the model computes by.
        params: the parameter pytree (see ``to_tree``), leaves ``jax.Array``.

    Raises:
        ValueError: from ``spec.init.init_params`` if ``seed`` is not a non-negative int.
    """

    def __init__(self, config: Config, seed: int = 0):
        self.config = config
        self.params = to_tree(init_params(config, seed))

    @classmethod
    def _of(cls, config: Config, params: Params) -> Transformer:
        """A model holding ``params`` as they are (checked by the caller): no initialisation."""
        model = object.__new__(cls)
        model.config, model.params = config, params
        return model

    def _forward_weights(self) -> tuple[Params, bool]:
        """The parameters for ``__call__`` and ``encode``, and whether they are ``weights_f32``'s already.

        Those run on ``weights_f32`` (many-row products are faster in fp32). In bf16 mode outside a trace it
        is computed once and kept while ``self.params`` holds the same leaves (JAX arrays are immutable, so
        the same leaves are the same weights), at the cost of fp32 memory for every parameter. Inside the
        caller's ``jit`` (traced leaves) and in fp32 mode the jitted program computes it itself.
        """
        leaves, tree = jax.tree.flatten(self.params)
        if self.config.dtype != "bfloat16" or any(isinstance(x, jax.core.Tracer) for x in leaves):
            return self.params, False
        kept = self.__dict__.get("_weights_f32")
        if kept is None or kept[1] != tree or any(a is not b for a, b in zip(kept[0], leaves, strict=True)):
            kept = (leaves, tree, weights_f32(self.params, self.config))
            self.__dict__["_weights_f32"] = kept
        return kept[2], True

    def tree_flatten(self) -> tuple[tuple[Params], Config]:
        return (self.params,), self.config

    @classmethod
    def tree_unflatten(cls, config: Config, children: tuple[Params]) -> Transformer:
        return cls._of(config, children[0])

    def __call__(self, src: Ids, tgt_in: Ids, intermediates: bool = False
                 ) -> Float[jax.Array, "B T V"] | tuple[Float[jax.Array, "B T V"], dict[str, jax.Array]]:
        """Teacher-forced forward (section 3): src (B, S), tgt_in (B, T) int -> logits (B, T, V) float32.

        With ``intermediates=True``: ``(logits, {name: jax.Array})``, the tensors of
        ``spec.shapes.intermediates`` in ``config.dtype``. See ``forward``.

        Raises:
            ValueError: from ``spec.validate.check_forward``.
        """
        params, rounded = self._forward_weights()
        return _checked_forward(params, self.config, src, tgt_in, intermediates, rounded)

    def encode(self, src: Ids) -> Float[jax.Array, "B S D"]:
        """Encoder stack (section 3.1): src (B, S) int -> memory (B, S, D) in ``config.dtype``.

        Raises:
            ValueError: from ``spec.validate.check_source``.
        """
        params, rounded = self._forward_weights()
        return _checked_encode(params, self.config, src, rounded)

    def init_cache(self, memory: Float[jax.Array, "B S D"], src: Ids, capacity: int) -> KVCache:
        """An empty ``KVCache`` of ``capacity`` target positions for ``memory`` (B, S, D) of ``src`` (B, S).

        The cross-attention K/V of ``memory`` are computed here, once (section 3.2.3).

        Raises:
            ValueError: from ``spec.validate.check_source`` and ``check_capacity``, or if
                ``memory`` does not match ``src``.
        """
        return init_cache(self.params, self.config, memory, src, capacity)

    def decode(self, tokens: Ids, cache: KVCache) -> tuple[Float[jax.Array, "B n V"], KVCache]:
        """n new tokens (B, n) int at positions ``cache.length ..`` -> (logits (B, n, V) float32, new cache).

        The cache passed in is consumed: go on with the returned one.

        Raises:
            ValueError: from ``spec.validate.check_decode``.
        """
        return decode(self.params, self.config, tokens, cache)
