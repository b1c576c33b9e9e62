"""The encoder-decoder Transformer (Vaswani et al., 2017, section 3) with a KV cache for decoding.

Every public entry point checks its token ids with ``spec.validate`` on a NumPy host copy before converting or
computing anything, so bad input raises the spec's ``ValueError`` with the spec's message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np
import torch
from torch import Tensor, nn

import spec
from impl_torch.layers import (
    DTYPES,
    DecoderLayer,
    Embedding,
    EncoderLayer,
    LayerNorm,
    as_float,
    project,
)
from spec import validate
from spec.config import Config
from spec.recording import record, recording, scope

Ids = Tensor | np.ndarray | Sequence[Sequence[int]]  # token ids (B, L), any integer dtype

if TYPE_CHECKING:  # shape hints for readers and type checkers (jaxtyping); nothing of it is imported at run time
    from jaxtyping import Bool, Float


@dataclasses.dataclass
class KVCache:
    """Decoder state for incremental decoding (the decoder of section 3.1, a few positions per call); fields in
    the order of ``spec.api.KV_CACHE_FIELDS``.

    self_kv[l]: layer l's self-attention (k (B, H, P, K), v (B, H, P, C)), preallocated for P = ``capacity``
    target positions; key_mask (B, P) bool, True at a written non-pad position; memory_kv[l]: layer l's
    cross-attention (k (B, H, S, K), v (B, H, S, C)) of the encoder output, computed once; memory_mask (B, S)
    bool, True at a non-pad source position; ``length``: the positions written. ``Transformer.decode`` writes
    the cache it is given in place and returns it.
    """

    self_kv: list[tuple[Float[Tensor, "B H P K"], Float[Tensor, "B H P C"]]]
    key_mask: Bool[Tensor, "B P"]
    memory_kv: list[tuple[Float[Tensor, "B H S K"], Float[Tensor, "B H S C"]]]
    memory_mask: Bool[Tensor, "B S"]
    length: int = 0

    def __post_init__(self) -> None:
        # Attention reads keys/values as fp32. For a bf16 cache on the CPU, an exact fp32 copy
        # is kept beside it and written with it, so a decode step does not upcast the whole prefix again; on CUDA
        # bf16 attention reads bf16 (``scaled_dot_product_attention``).
        first = self.self_kv[0][0] if self.self_kv else None
        self._float_kv = self._float_memory_kv = None
        if first is not None and first.dtype != torch.float32 and not first.is_cuda:
            self._float_kv = [(k.float(), v.float()) for k, v in self.self_kv]
            self._float_memory_kv = [(k.float(), v.float()) for k, v in self.memory_kv]

    def memory_kv_of(self, layer: int) -> tuple[Tensor, Tensor]:
        """``memory_kv[layer]`` as attention reads it (the exact fp32 copy for a bf16 cache on the CPU)."""
        return (self._float_memory_kv or self.memory_kv)[layer]

    @property
    def capacity(self) -> int:
        """P, the target positions the cache has room for."""
        return self.key_mask.shape[1]

    def write(self, layer: int, start: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k (B, H, n, K), v (B, H, n, C) of positions start..start+n-1 of ``layer``; return the keys
        (B, H, t, K) and values (B, H, t, C) of positions 0..t-1, t = start + n (fp32 on the CPU: the exact copy
        kept beside a bf16 cache)."""
        end = start + k.shape[2]
        ck, cv = self.self_kv[layer]
        ck[:, :, start:end], cv[:, :, start:end] = k, v
        if self._float_kv is not None:  # the fp32 copy (``__post_init__``), exact, which attention reads
            ck, cv = self._float_kv[layer]
            ck[:, :, start:end], cv[:, :, start:end] = k, v
        return ck[:, :, :end], cv[:, :, :end]

    def select(self, rows: Tensor) -> None:
        """Reorder the self-attention state to batch rows ``rows`` (B,), in place (beam search).

        Cross-attention K/V and the memory mask are left as they are: ``rows`` must map each row to a row of the
        same source, as beam reordering does, so the work is proportional to the filled prefix only.
        """
        n = self.length
        for ck, cv in [*self.self_kv, *(self._float_kv or [])]:
            ck[:, :, :n], cv[:, :, :n] = ck[rows, :, :n], cv[rows, :, :n]
        self.key_mask[:, :n] = self.key_mask[rows, :n]


def to_tensor(a: np.ndarray) -> Tensor:
    """A NumPy array (bf16 as ``ml_dtypes.bfloat16``) as a CPU tensor with the same bits."""
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)  # NumPy has no bf16
    return torch.from_numpy(np.ascontiguousarray(a))


def to_array(t: Tensor) -> np.ndarray:
    """A tensor as a NumPy array with the same bits (bf16 as ``ml_dtypes.bfloat16``)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def host_ids(ids: Ids) -> np.ndarray:
    """A NumPy host copy of token ids, for ``spec.validate`` (dtype kept, so a float array is reported)."""
    if isinstance(ids, Tensor):
        ids = ids.detach().cpu()
        return (ids.float() if ids.dtype == torch.bfloat16 else ids).numpy()  # NumPy has no bf16
    return np.asarray(ids)


def device_ids(ids: Ids, device: torch.device) -> Tensor:
    """Validated token ids as an int64 tensor on ``device`` (NumPy arrays in any memory layout)."""
    return torch.as_tensor(np.ascontiguousarray(ids) if not isinstance(ids, Tensor) else ids, device=device).long()


def key_padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """(B, L) ids -> (B, L) bool, True where the key is not padding."""
    return ids != pad_id


def causal_mask(start: int, n: int, device: torch.device) -> Tensor:
    """(n, start + n) bool: the query at position start + i may attend keys 0..start + i (section 3.2.3)."""
    q_pos = torch.arange(start, start + n, device=device)[:, None]
    return torch.arange(start + n, device=device)[None, :] <= q_pos


class Encoder(nn.Module):
    """N encoder layers, then (pre-LN only) a final LayerNorm: (B, S, D) -> (B, S, D)."""

    def __init__(self, config: Config, device: torch.device | str | None = None):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config, device) for _ in range(config.n_encoder_layers))
        self.final_norm = LayerNorm(config, device) if config.norm_first else None

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x (B, S, D), mask (B, 1, 1, S) key padding mask."""
        for i, layer in enumerate(self.layers):
            with scope(f"encoder.layers.{i}"):
                x = record("out", layer(x, mask))
        return x if self.final_norm is None else self.final_norm(x)


class Decoder(nn.Module):
    """N decoder layers, then (pre-LN only) a final LayerNorm: (B, n, D) -> (B, n, D)."""

    def __init__(self, config: Config, device: torch.device | str | None = None):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(config, device) for _ in range(config.n_decoder_layers))
        self.final_norm = LayerNorm(config, device) if config.norm_first else None

    def forward(self, y: Tensor, cache: KVCache, self_mask: Tensor) -> Tensor:
        """n new positions y (B, n, D) at ``cache.length``.., self_mask (B, 1, n, cache.length + n).

        Writes the new positions' self-attention keys/values into ``cache`` and advances ``cache.length``.
        """
        start, memory_mask = cache.length, cache.memory_mask[:, None, None, :]           # (B, 1, 1, S)
        for i, layer in enumerate(self.layers):
            with scope(f"decoder.layers.{i}"):
                y = record("out", layer(y, cache.memory_kv_of(i), memory_mask, self_mask,
                                        functools.partial(cache.write, i, start)))
        cache.length = start + y.shape[1]
        return y if self.final_norm is None else self.final_norm(y)


class Transformer(nn.Module):
    """The encoder-decoder Transformer of "Attention Is All You Need" (section 3), numerics of ``spec.numerics``.

    ``Transformer(config, seed)`` holds ``spec.init_params(config, seed)`` (the paper's initialisation, drawn
    with NumPy, not torch's RNG: the same bits in every backend); ``impl_torch.from_params`` and
    ``impl_torch.load_weights`` build one holding given parameters. Parameters are stored in
    ``config.param_dtype`` and activations computed in ``config.dtype`` (bf16 by default, float32 on request).
    The state_dict keys are the canonical parameter names of ``spec.schema`` (``embedding``,
    ``encoder.layers.0.self_attn.w_q``, ...).

    A new model is in training mode, as every ``nn.Module``: dropout (section 5.4) is active until ``.eval()``;
    ``greedy_search`` and ``beam_search`` always compute in evaluation mode. ``.to(device)`` moves it;
    ``.to(dtype)``, ``.float()`` and ``.bfloat16()`` cast the parameters and set ``config.param_dtype`` to match.
    On CUDA, compute inside ``impl_torch.contract_numerics()`` to meet the contract.

    Raises:
        ValueError: from ``spec.init_params`` if ``seed`` is not a non-negative int.
    """

    def __init__(self, config: Config, seed: int = 0, *, device: torch.device | str | None = None):
        params = spec.init_params(config, seed)
        super().__init__()
        self._build(config, device)
        self._assign(params)

    @classmethod
    def _of(cls, config: Config, params: dict[str, np.ndarray], device: torch.device | str | None
                 ) -> Transformer:
        """A model holding ``params`` (checked by ``spec.weights_io.check_params``), built without drawing the
        seed's initialisation first (slow at the paper's sizes)."""
        model = cls.__new__(cls)
        nn.Module.__init__(model)
        model._build(config, device)
        model._assign(params)
        return model

    def _build(self, config: Config, device: torch.device | str | None) -> None:
        """The modules, with parameters of the schema's shapes in ``config.param_dtype``, not yet set."""
        self.config = config
        dtype = DTYPES[config.param_dtype]
        self.embedding = nn.Parameter(torch.empty(config.vocab_size, config.d_model, dtype=dtype, device=device))
        self.embed = Embedding(config, device)
        self.encoder = Encoder(config, device)
        self.decoder = Decoder(config, device)

    def _assign(self, params: dict[str, np.ndarray]) -> None:
        """Copy canonical ``params`` ({name: array}, the stored dtypes) into the parameters, bit for bit."""
        self.load_state_dict({name: to_tensor(a) for name, a in params.items()})

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Transformer:
        """``nn.Module._apply`` (under ``.to``, ``.cuda``, ``.float``, ``.bfloat16``, ...), keeping ``config`` true.

        A cast of the parameters to bf16 or fp32 sets ``config.param_dtype``; ``config.dtype`` stays, since rule 0
        casts parameters to the activation dtype where they are read. The positional-encoding table stays fp32
        (rule 3) and only moves device.

        Raises:
            ValueError: naming the dtype, for a cast to any other floating-point dtype (float16, float64),
                before anything changes: the spec stores parameters in bf16 or fp32 only.
        """
        # What ``fn`` does to a floating-point parameter, seen on an empty one: cast, move, or neither.
        probe = fn(torch.empty(0, dtype=self.embedding.dtype, device=self.embedding.device))
        param_dtype = next((name for name, d in DTYPES.items() if d == probe.dtype), None)
        if param_dtype is None:
            raise ValueError(f"cannot cast the parameters to {probe.dtype}: param_dtype must be one of "
                             f"{tuple(DTYPES)}")
        pe = self.embed.pe
        super()._apply(fn, recurse)
        self.embed.pe = pe.to(probe.device)
        self.config = self.config.replace(param_dtype=param_dtype)
        return self

    @property
    def device(self) -> torch.device:
        """The device the parameters are on."""
        return self.embedding.device

    # ------------------------------------------------------------- public entry points

    def forward(self, src: Ids, tgt_in: Ids, intermediates: bool = False
                ) -> Float[Tensor, "B T V"] | tuple[Float[Tensor, "B T V"], dict[str, Tensor]]:
        """Teacher-forced forward (section 3): src (B, S), tgt_in (B, T) int ids -> logits (B, T, V) float32.

        With ``intermediates=True`` returns ``(logits, {name: tensor})`` with the tensors of
        ``spec.shapes.intermediates`` (activations in ``config.dtype``). Positions of padding tokens produce
        finite, unspecified values.

        Raises:
            ValueError: from ``spec.validate.check_forward``.
        """
        validate.check_forward(host_ids(src), host_ids(tgt_in), self.config)
        src, tgt_in = device_ids(src, self.device), device_ids(tgt_in, self.device)
        # ``record`` is a no-op outside ``recording()``, so one code path serves both.
        with recording() if intermediates else contextlib.nullcontext() as rec:
            logits = self._decode(tgt_in, self._init_cache(self._encode(src), src, tgt_in.shape[1]))
        return (logits, rec) if intermediates else logits

    def encode(self, src: Ids) -> Float[Tensor, "B S D"]:
        """Encoder stack (section 3.1): src (B, S) int ids -> memory (B, S, D) in ``config.dtype``.

        Raises:
            ValueError: from ``spec.validate.check_source``.
        """
        validate.check_source(host_ids(src), self.config)
        return self._encode(device_ids(src, self.device))

    def init_cache(self, memory: Float[Tensor, "B S D"], src: Ids, capacity: int) -> KVCache:
        """An empty KV cache for decoding up to ``capacity`` target positions against ``memory`` (B, S, D) of
        ``src`` (B, S): computes every decoder layer's cross-attention keys/values (B, H, S, K|C) once.

        Raises:
            ValueError: from ``spec.validate.check_source`` and ``check_capacity`` (an int in [1, max_len]).
        """
        validate.check_source(host_ids(src), self.config)
        validate.check_capacity(capacity, self.config)
        return self._init_cache(memory, device_ids(src, self.device), int(capacity))

    def decode(self, tokens: Ids, cache: KVCache) -> tuple[Float[Tensor, "B n V"], KVCache]:
        """Decoder stack (section 3.1) over n new tokens (B, n) at positions ``cache.length``.. ->
        (logits (B, n, V) float32, cache).

        Self-attention sees every earlier position (from the cache) and the new ones causally (section 3.2.3),
        minus padding keys. ``cache`` is written in place and returned: go on with the returned one. The work per
        token does not grow with the prefix except for attention itself.

        Raises:
            ValueError: from ``spec.validate.check_decode``: bad ids, a batch that differs from the cache's, or
                no room in the cache for n more positions.
        """
        validate.check_decode(host_ids(tokens), self.config, cache.key_mask.shape[0], cache.length, cache.capacity)
        return self._decode(device_ids(tokens, self.device), cache), cache

    def output_projection(self, h: Tensor) -> Tensor:
        """Tied output projection h E^T (section 3.4, rule 7): (B, n, D) -> (B, n, V) float32, never rounded."""
        if h.is_cuda:
            return project("bnd,vd->bnv", h, self.embedding, out_dtype=torch.float32)
        table = as_float(self.embedding, h.dtype)                                        # (V, D) fp32
        return (h.reshape(-1, h.shape[-1]).float() @ table.T).reshape(*h.shape[:-1], -1)  # one 2-D GEMM

    # ------------------------------------------------------------- unchecked internals (validated ids)

    def _encode(self, src: Tensor) -> Tensor:
        mask = key_padding_mask(src, self.config.pad_id)[:, None, None, :]             # (B, 1, 1, S)
        x = record("src_embed", self.embed(self.embedding, src))
        return record("encoder.out", self.encoder(x, mask))

    def _init_cache(self, memory: Tensor, src: Tensor, capacity: int) -> KVCache:
        c, B = self.config, memory.shape[0]
        # Heads-major (B, H, L, K) memory: attention's per-head products read a prefix in place instead of copying
        # the whole prefix at every step.
        empty = lambda d: torch.empty(B, c.n_heads, capacity, d, dtype=memory.dtype, device=memory.device)  # noqa: E731
        return KVCache(
            self_kv=[(empty(c.d_k), empty(c.d_v)) for _ in self.decoder.layers],
            key_mask=torch.zeros(B, capacity, dtype=torch.bool, device=memory.device),
            memory_kv=[tuple(t.contiguous() for t in layer.cross_attn.project_kv(memory))
                       for layer in self.decoder.layers],
            memory_mask=key_padding_mask(src, c.pad_id))

    def _decode(self, tokens: Tensor, cache: KVCache) -> Tensor:
        start, n = cache.length, tokens.shape[1]
        cache.key_mask[:, start:start + n] = key_padding_mask(tokens, self.config.pad_id)
        key_mask = cache.key_mask[:, None, None, :start + n]                          # (B, 1, 1, t)
        self_mask = causal_mask(start, n, tokens.device) & key_mask                   # (B, 1, n, t)
        y = record("tgt_embed", self.embed(self.embedding, tokens, start))
        y = record("decoder.out", self.decoder(y, cache, self_mask))
        return record("logits", self.output_projection(y))
