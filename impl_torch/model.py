"""The encoder-decoder Transformer (Vaswani et al., 2017, section 3) with a KV cache for decoding.

Every public entry point checks its token ids with ``spec.validate`` on a NumPy host copy before converting or
computing anything, so bad input raises the spec's ``ValueError`` with the spec's message.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import torch
from torch import Tensor, nn

from impl_torch.layers import (
    DTYPES,
    DecoderLayer,
    Embedding,
    EncoderLayer,
    LayerNorm,
    Record,
    contract_numerics,
    project,
    record_as,
)
from spec import validate
from spec.config import Config
from spec.schema import param_specs

Ids = Tensor | np.ndarray


@dataclasses.dataclass
class KVCache:
    """Decoder state: cross-attention K/V computed once per source, self-attention K/V written per step.

    memory_kv[l]: (k (B, H, S, K), v (B, H, S, C)); memory_mask (B, 1, 1, S) bool;
    self_kv[l]: (k (B, H, N, K), v (B, H, N, C)), preallocated for N = ``capacity`` positions;
    key_mask (B, N) bool, True = not padding; ``length`` positions are filled.
    """

    memory_kv: list[tuple[Tensor, Tensor]]
    memory_mask: Tensor
    self_kv: list[tuple[Tensor, Tensor]]
    key_mask: Tensor
    length: int = 0

    @property
    def capacity(self) -> int:
        return self.key_mask.shape[1]

    def write(self, layer: int, start: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store keys/values of positions start..start+n-1 of ``layer``; return those of positions 0..start+n-1."""
        end = start + k.shape[2]
        ck, cv = self.self_kv[layer]
        ck[:, :, start:end], cv[:, :, start:end] = k, v
        return ck[:, :, :end], cv[:, :, :end]

    def select(self, rows: Tensor) -> None:
        """Reorder the self-attention state to batch rows ``rows`` (B,), in place (beam search).

        Cross-attention K/V and the memory mask are left as they are: ``rows`` must map each row to a row of the
        same source, as beam reordering does, so the work is proportional to the filled prefix only.
        """
        n = self.length
        for ck, cv in self.self_kv:
            ck[:, :, :n], cv[:, :, :n] = ck[rows, :, :n], cv[rows, :, :n]
        self.key_mask[:, :n] = self.key_mask[rows, :n]


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
    """(B, L) ids -> (B, 1, 1, L) bool, True where the key is not padding."""
    return (ids != pad_id)[:, None, None, :]


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

    def forward(self, x: Tensor, mask: Tensor, record: Record = None) -> Tensor:
        """x (B, S, D), mask (B, 1, 1, S) key padding mask."""
        for i, layer in enumerate(self.layers):
            rec = None if record is None else {}
            x = _merge(record, f"encoder.layers.{i}", rec, layer(x, mask, rec))
        return x if self.final_norm is None else self.final_norm(x)


class Decoder(nn.Module):
    """N decoder layers, then (pre-LN only) a final LayerNorm: (B, n, D) -> (B, n, D)."""

    def __init__(self, config: Config, device: torch.device | str | None = None):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(config, device) for _ in range(config.n_decoder_layers))
        self.final_norm = LayerNorm(config, device) if config.norm_first else None

    def forward(self, y: Tensor, cache: KVCache, self_mask: Tensor, record: Record = None) -> Tensor:
        """n new positions y (B, n, D) at ``cache.length``.., self_mask (B, 1, n, cache.length + n).

        Writes the new positions' self-attention keys/values into ``cache`` and advances ``cache.length``.
        """
        start = cache.length
        for i, layer in enumerate(self.layers):
            rec = None if record is None else {}
            out = layer(y, cache.memory_kv[i], cache.memory_mask, self_mask, functools.partial(cache.write, i, start),
                        rec)
            y = _merge(record, f"decoder.layers.{i}", rec, out)
        cache.length = start + y.shape[1]
        return y if self.final_norm is None else self.final_norm(y)


def _merge(record: Record, prefix: str, rec: Record, out: Tensor) -> Tensor:
    """Record a layer's intermediates ``rec`` under ``prefix``, and its output as ``prefix.out``."""
    if record is not None:
        record.update({f"{prefix}.{k}": v for k, v in rec.items()})
        record[f"{prefix}.out"] = out
    return out


class Transformer(nn.Module):
    """The encoder-decoder Transformer of "Attention Is All You Need" (section 3), numerics of ``spec.numerics``.

    Built from a ``spec.config.Config``: parameters in ``config.param_dtype``, activations in ``config.dtype``
    (bf16 by default, float32 on request); choose them through the config, not ``.to(dtype)``. The state_dict keys
    are the canonical parameter names of ``spec.schema`` (``embedding``, ``encoder.layers.0.self_attn.w_q``, ...).
    Parameters are initialised as in the paper's setup (``reset_parameters``); ``impl_torch.load_weights`` or
    ``impl_torch.from_params`` load trained ones. Dropout (section 5.4) is active in training mode only: call
    ``.eval()`` for inference (``load_weights`` does). Constructing one calls ``contract_numerics()``.
    """

    def __init__(self, config: Config, device: torch.device | str | None = None):
        super().__init__()
        contract_numerics()
        self.config = config
        dtype = DTYPES[config.param_dtype]
        self.embedding = nn.Parameter(torch.empty(config.vocab_size, config.d_model, dtype=dtype, device=device))
        self.embed = Embedding(config, device)
        self.encoder = Encoder(config, device)
        self.decoder = Decoder(config, device)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Embedding U(+-sqrt(3/D)) (mean 0, variance 1/D), Glorot-uniform projections with the schema's fans,
        LayerNorm scale 1, biases 0 (as ``spec.init.init_params``, drawn from torch's RNG)."""
        params = dict(self.named_parameters())
        for s in param_specs(self.config):
            p = params[s.name]
            if s.kind == "embedding":
                p.uniform_(-math.sqrt(3.0 / self.config.d_model), math.sqrt(3.0 / self.config.d_model))
            elif s.kind == "linear":
                a = math.sqrt(6.0 / (s.fan_in + s.fan_out))
                p.uniform_(-a, a)
            else:
                p.fill_(1.0 if s.kind == "norm_scale" else 0.0)

    @property
    def device(self) -> torch.device:
        return self.embedding.device

    # ------------------------------------------------------------- public entry points

    def forward(self, src: Ids, tgt_in: Ids, intermediates: bool = False
                ) -> Tensor | tuple[Tensor, dict[str, Tensor]]:
        """Teacher-forced forward: src (B, S), tgt_in (B, T) int ids -> logits (B, T, V) float32.

        With ``intermediates=True`` returns ``(logits, {name: tensor})`` with the tensors of
        ``spec.shapes.intermediates`` (activations in the activation dtype). Positions of padding tokens
        produce finite, unspecified values.

        Raises:
            ValueError: from ``spec.validate.check_forward``.
        """
        validate.check_forward(host_ids(src), host_ids(tgt_in), self.config)
        src, tgt_in = device_ids(src, self.device), device_ids(tgt_in, self.device)
        record = {} if intermediates else None
        cache = self._init_cache(self._encode(src, record), src, tgt_in.shape[1])
        logits = self._decode(tgt_in, cache, record)
        return (logits, {**record, "logits": logits}) if intermediates else logits

    def encode(self, src: Ids) -> Tensor:
        """Encoder stack: src (B, S) int ids -> memory (B, S, D) in the activation dtype.

        Raises:
            ValueError: from ``spec.validate.check_source``.
        """
        validate.check_source(host_ids(src), self.config)
        return self._encode(device_ids(src, self.device))

    def init_cache(self, memory: Tensor, src: Ids, capacity: int) -> KVCache:
        """An empty KV cache for decoding up to ``capacity`` target positions against ``memory`` (B, S, D) of
        ``src`` (B, S): computes every decoder layer's cross-attention keys/values once.

        Raises:
            ValueError: from ``spec.validate.check_source`` and ``check_capacity`` (an int in [1, max_len]).
        """
        validate.check_source(host_ids(src), self.config)
        validate.check_capacity(capacity, self.config)
        return self._init_cache(memory, device_ids(src, self.device), int(capacity))

    def decode(self, tokens: Ids, cache: KVCache) -> Tensor:
        """Decoder stack over n new tokens (B, n) at positions ``cache.length``.. -> logits (B, n, V) float32.

        Self-attention sees every earlier position (from the cache) and the new ones causally, minus padding
        keys. Updates ``cache`` in place: the work per token does not grow with the prefix except for attention
        itself.

        Raises:
            ValueError: from ``spec.validate.check_decode``: bad ids, a batch that differs from the cache's, or
                no room in the cache for n more positions.
        """
        validate.check_decode(host_ids(tokens), self.config, cache.key_mask.shape[0], cache.length, cache.capacity)
        return self._decode(device_ids(tokens, self.device), cache)

    def output_projection(self, h: Tensor) -> Tensor:
        """Tied output projection h E^T (section 3.4, rule 7): (B, n, D) -> (B, n, V) float32, never rounded."""
        return project("bnd,vd->bnv", h, self.embedding, out_dtype=torch.float32)

    # ------------------------------------------------------------- unchecked internals (validated ids)

    def _encode(self, src: Tensor, record: Record = None) -> Tensor:
        x = record_as(record, "src_embed", self.embed(self.embedding, src))
        return record_as(record, "encoder.out", self.encoder(x, key_padding_mask(src, self.config.pad_id), record))

    def _init_cache(self, memory: Tensor, src: Tensor, capacity: int) -> KVCache:
        c, B = self.config, memory.shape[0]
        empty = lambda d: torch.empty(B, c.n_heads, capacity, d, dtype=memory.dtype, device=memory.device)  # noqa: E731
        return KVCache(
            memory_kv=[layer.cross_attn.project_kv(memory) for layer in self.decoder.layers],
            memory_mask=key_padding_mask(src, c.pad_id),
            self_kv=[(empty(c.d_k), empty(c.d_v)) for _ in self.decoder.layers],
            key_mask=torch.zeros(B, capacity, dtype=torch.bool, device=memory.device))

    def _decode(self, tokens: Tensor, cache: KVCache, record: Record = None) -> Tensor:
        start, n = cache.length, tokens.shape[1]
        cache.key_mask[:, start:start + n] = tokens != self.config.pad_id
        key_mask = cache.key_mask[:, None, None, :start + n]                          # (B, 1, 1, t)
        self_mask = causal_mask(start, n, tokens.device) & key_mask                   # (B, 1, n, t)
        y = record_as(record, "tgt_embed", self.embed(self.embedding, tokens, start))
        y = record_as(record, "decoder.out", self.decoder(y, cache, self_mask, record))
        return self.output_projection(y)
