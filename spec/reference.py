"""NumPy reference of the Transformer (Vaswani et al., 2017), exact or contract-faithful.

``Numerics("exact")`` computes in float64 and never rounds; ``Numerics("bfloat16")``
and ``Numerics("float32")`` round exactly where ``spec.numerics`` says. Arrays
are float64 throughout (holding values representable in the dtype they were
last rounded to). Every function is module-level so that the conformance
suite's mutants can replace one piece at a time.

The decoder has one code path: ``decode`` consumes ``n`` new target tokens
against a ``Cache`` of everything before them. A full forward is one call with
all T tokens and an empty cache; incremental decoding is T calls of one token.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from spec import validate
from spec.config import Config
from spec.numerics import MASKED_SCORE, Numerics, np_dtype

Params = dict[str, np.ndarray]
Record = dict[str, np.ndarray] | None


def as_float64(params: dict[str, np.ndarray], c: Config) -> Params:
    """Canonical parameters as they enter the computation: cast from ``c.param_dtype`` to
    ``c.dtype`` (``spec.numerics`` rule 0), held as exact float64 copies.

    Exact mode computes with these too: the model a mixed-precision config
    describes is the one whose parameters are the cast values.
    """
    dtype = np_dtype(c.dtype)
    return {k: np.asarray(v).astype(dtype).astype(np.float64) for k, v in params.items()}


def _rec(rec: Record, name: str, x: np.ndarray) -> np.ndarray:
    if rec is not None:
        rec[name] = x
    return x


# ----------------------------------------------------------------- embedding

def positional_encoding(length: int, d_model: int) -> np.ndarray:
    """Sinusoidal table (length, D), float64 (section 3.5), interleaved.

    ``PE[pos, 2i] = sin(pos / 10000^(2i/D))``, ``PE[pos, 2i+1] = cos(...)``,
    positions from 0.
    """
    pos = np.arange(length, dtype=np.float64)[:, None]           # (L, 1)
    two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]  # (1, D/2)
    angle = pos / 10000.0 ** (two_i / d_model)                   # (L, D/2)
    pe = np.empty((length, d_model))
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle)
    return pe


def embed(params: Params, ids: np.ndarray, c: Config, nx: Numerics, start: int = 0) -> np.ndarray:
    """``E[ids] * sqrt(D) + PE[start:start+L]`` (section 3.4), (B, L) -> (B, L, D)."""
    L = ids.shape[1]
    pe = nx.acc(positional_encoding(start + L, c.d_model)[start:])  # (L, D) in fp32
    x = params["embedding"][ids] * nx.acc(np.sqrt(c.d_model))        # (B, L, D)
    return nx.act(x + pe)


# ----------------------------------------------------------------- masks

def key_padding_mask(ids: np.ndarray, c: Config) -> np.ndarray:
    """(B, L) ids -> (B, 1, 1, L) bool, True where the key is not padding."""
    return (ids != c.pad_id)[:, None, None, :]


def causal_mask(q_start: int, n_q: int, n_k: int) -> np.ndarray:
    """(1, 1, n_q, n_k) bool: query at position q_start+i may attend key j <= q_start+i."""
    q_pos = np.arange(q_start, q_start + n_q)[:, None]
    return (np.arange(n_k)[None, :] <= q_pos)[None, None]


# ----------------------------------------------------------------- attention

def attention_scale(d_k: int) -> float:
    """1/sqrt(d_k) (equation 1)."""
    return 1.0 / np.sqrt(d_k)


def softmax(x: np.ndarray) -> np.ndarray:
    """Max-subtracted softmax over the last axis (exact)."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def scaled_dot_product_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray,
                                 nx: Numerics) -> np.ndarray:
    """softmax(Q K^T / sqrt(d_k)) V (equation 1).

    q (B, T, H, K), k (B, S, H, K), v (B, S, H, C), mask broadcastable to
    (B, H, T, S), True = may attend. Returns (B, T, H, C).
    """
    scores = nx.acc(np.einsum("bthk,bshk->bhts", q, k))          # (B, H, T, S) fp32
    scores = nx.acc(scores * nx.acc(attention_scale(q.shape[-1])))
    scores = np.where(mask, scores, MASKED_SCORE)
    probs = nx.act(nx.acc(softmax(scores)))                       # rounded before P V
    return nx.act(np.einsum("bhts,bshc->bthc", probs, v))         # (B, T, H, C)


def attention_kv(params: Params, prefix: str, x_kv: np.ndarray, nx: Numerics) -> tuple[np.ndarray, np.ndarray]:
    """Key and value projections: (B, S, D) -> k (B, S, H, K), v (B, S, H, C)."""
    k = nx.act(np.einsum("bsd,dhk->bshk", x_kv, params[f"{prefix}.w_k"]))
    v = nx.act(np.einsum("bsd,dhc->bshc", x_kv, params[f"{prefix}.w_v"]))
    return k, v


def attend(params: Params, prefix: str, x_q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray,
           nx: Numerics) -> np.ndarray:
    """Query projection, attention over (k, v) and output projection: (B, T, D) -> (B, T, D)."""
    q = nx.act(np.einsum("btd,dhk->bthk", x_q, params[f"{prefix}.w_q"]))   # (B, T, H, K)
    o = scaled_dot_product_attention(q, k, v, mask, nx)                      # (B, T, H, C)
    return nx.act(np.einsum("bthc,hcd->btd", o, params[f"{prefix}.w_o"]))   # (B, T, D)


def multi_head_attention(params: Params, prefix: str, x_q: np.ndarray, x_kv: np.ndarray, mask: np.ndarray,
                         nx: Numerics) -> np.ndarray:
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O (section 3.2.2): (B, T, D), (B, S, D) -> (B, T, D)."""
    k, v = attention_kv(params, prefix, x_kv, nx)
    return attend(params, prefix, x_q, k, v, mask, nx)


def cross_attention(params: Params, prefix: str, y: np.ndarray, memory_kv: tuple[np.ndarray, np.ndarray],
                    memory_mask: np.ndarray, nx: Numerics) -> np.ndarray:
    """Encoder-decoder attention: queries from the decoder, keys/values from the encoder output."""
    return attend(params, prefix, y, *memory_kv, memory_mask, nx)


# ----------------------------------------------------------------- FFN, norm

def activation(x: np.ndarray) -> np.ndarray:
    """ReLU (equation 2)."""
    return np.maximum(x, 0.0)


def feed_forward(params: Params, prefix: str, x: np.ndarray, nx: Numerics) -> np.ndarray:
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (equation 2): (B, L, D) -> (B, L, D).

    ``np.einsum``, not ``@``: NumPy's own loops sum in one order on every machine, while BLAS picks kernels by
    CPU (OpenBLAS's Haswell and SkylakeX kernels gave float64 results differing in the last bits), and the golden
    files must regenerate bit for bit anywhere.
    """
    h = nx.act(np.einsum("bld,df->blf", x, params[f"{prefix}.w_1"]) + params[f"{prefix}.b_1"])      # (B, L, F)
    return nx.act(np.einsum("blf,fd->bld", activation(h), params[f"{prefix}.w_2"]) + params[f"{prefix}.b_2"])


def layer_norm(params: Params, prefix: str, x: np.ndarray, eps: float, nx: Numerics) -> np.ndarray:
    """LayerNorm over D (Ba et al., 2016) with ``scale`` and ``bias``; statistics in fp32 or better."""
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps) * params[f"{prefix}.scale"] + params[f"{prefix}.bias"]
    return nx.act(y)


def sublayer_connection(params: Params, prefix: str, name: str, x: np.ndarray, sublayer, c: Config,
                        nx: Numerics, rec: Record) -> np.ndarray:
    """Residual connection around ``sublayer`` (section 5.4).

    Post-LN (paper): ``LayerNorm(x + Sublayer(x))``. Pre-LN (``norm_first``):
    ``x + Sublayer(LayerNorm(x))``. Records ``{prefix}.{name}`` (the sublayer's
    output) and ``{prefix}.{name}.residual`` (the block's output).
    """
    norm = f"{prefix}.{name}_norm"
    if c.norm_first:
        y = _rec(rec, f"{prefix}.{name}", sublayer(layer_norm(params, norm, x, c.layer_norm_eps, nx)))
        out = nx.act(x + y)
    else:
        y = _rec(rec, f"{prefix}.{name}", sublayer(x))
        out = layer_norm(params, norm, nx.act(x + y), c.layer_norm_eps, nx)
    return _rec(rec, f"{prefix}.{name}.residual", out)


# ----------------------------------------------------------------- stacks

def encoder_layer(params: Params, prefix: str, x: np.ndarray, mask: np.ndarray, c: Config, nx: Numerics,
                  rec: Record) -> np.ndarray:
    """Self-attention then FFN, each in a sublayer connection (section 3.1): (B, S, D) -> (B, S, D)."""
    x = sublayer_connection(params, prefix, "self_attn", x,
                            lambda h: multi_head_attention(params, f"{prefix}.self_attn", h, h, mask, nx), c, nx, rec)
    return sublayer_connection(params, prefix, "ffn", x,
                               lambda h: feed_forward(params, f"{prefix}.ffn", h, nx), c, nx, rec)


def encode(params: Params, src: np.ndarray, c: Config, nx: Numerics, rec: Record = None) -> np.ndarray:
    """Encoder stack: src (B, S) int -> memory (B, S, D)."""
    mask = key_padding_mask(src, c)
    x = _rec(rec, "src_embed", embed(params, src, c, nx))
    for i in range(c.n_encoder_layers):
        x = _rec(rec, f"encoder.layers.{i}.out", encoder_layer(params, f"encoder.layers.{i}", x, mask, c, nx, rec))
    if c.norm_first:
        x = layer_norm(params, "encoder.final_norm", x, c.layer_norm_eps, nx)
    return _rec(rec, "encoder.out", x)


@dataclasses.dataclass
class Cache:
    """Decoder state: cross-attention K/V computed once per source; self-attention K/V appended per step.

    memory_kv[l]: (k (B, S, H, K), v (B, S, H, C)); memory_mask (B, 1, 1, S);
    self_kv[l]: (k (B, t, H, K), v (B, t, H, C)); key_mask (B, t) True = not padding.
    """
    memory_kv: list[tuple[np.ndarray, np.ndarray]]
    memory_mask: np.ndarray
    self_kv: list[tuple[np.ndarray, np.ndarray]]
    key_mask: np.ndarray

    @property
    def length(self) -> int:
        return self.key_mask.shape[1]

    def select(self, rows: np.ndarray) -> Cache:
        """The cache of batch rows ``rows`` (beam reordering)."""
        take = lambda kv: (kv[0][rows], kv[1][rows])  # noqa: E731
        return Cache([take(kv) for kv in self.memory_kv], self.memory_mask[rows],
                     [take(kv) for kv in self.self_kv], self.key_mask[rows])


def init_cache(params: Params, memory: np.ndarray, src: np.ndarray, c: Config, nx: Numerics) -> Cache:
    """An empty decoder cache for ``memory`` (B, S, D) of source ``src`` (B, S)."""
    B, H = memory.shape[0], c.n_heads
    kv = [attention_kv(params, f"decoder.layers.{i}.cross_attn", memory, nx) for i in range(c.n_decoder_layers)]
    empty = [(np.zeros((B, 0, H, c.d_k)), np.zeros((B, 0, H, c.d_v))) for _ in range(c.n_decoder_layers)]
    return Cache(kv, key_padding_mask(src, c), empty, np.zeros((B, 0), bool))


def decoder_layer(params: Params, prefix: str, i: int, y: np.ndarray, cache: Cache, self_mask: np.ndarray,
                  c: Config, nx: Numerics, rec: Record) -> np.ndarray:
    """Masked self-attention, cross-attention, FFN (section 3.1): (B, n, D) -> (B, n, D).

    Appends this layer's new self-attention keys/values to ``cache.self_kv[i]``.
    """
    def self_attn(h):
        k, v = attention_kv(params, f"{prefix}.self_attn", h, nx)
        k = np.concatenate([cache.self_kv[i][0], k], axis=1)
        v = np.concatenate([cache.self_kv[i][1], v], axis=1)
        cache.self_kv[i] = (k, v)
        return attend(params, f"{prefix}.self_attn", h, k, v, self_mask, nx)

    y = sublayer_connection(params, prefix, "self_attn", y, self_attn, c, nx, rec)
    y = sublayer_connection(params, prefix, "cross_attn", y,
                            lambda h: cross_attention(params, f"{prefix}.cross_attn", h, cache.memory_kv[i],
                                                      cache.memory_mask, nx), c, nx, rec)
    return sublayer_connection(params, prefix, "ffn", y, lambda h: feed_forward(params, f"{prefix}.ffn", h, nx),
                               c, nx, rec)


def output_logits(params: Params, h: np.ndarray, nx: Numerics) -> np.ndarray:
    """Tied output projection h E^T (section 3.4): (B, n, D) -> (B, n, V) fp32 logits."""
    return nx.acc(np.einsum("bnd,vd->bnv", h, params["embedding"]))


def decode(params: Params, tokens: np.ndarray, cache: Cache, c: Config, nx: Numerics, rec: Record = None) -> np.ndarray:
    """Decoder stack over ``n`` new tokens at positions ``cache.length ...``: (B, n) -> logits (B, n, V).

    Self-attention sees every earlier position (from the cache) and the new
    ones causally, minus padding keys. Updates ``cache`` in place.
    """
    start, n = cache.length, tokens.shape[1]
    cache.key_mask = np.concatenate([cache.key_mask, tokens != c.pad_id], axis=1)         # (B, start+n)
    self_mask = causal_mask(start, n, start + n) & cache.key_mask[:, None, None, :]      # (B, 1, n, start+n)
    y = _rec(rec, "tgt_embed", embed(params, tokens, c, nx, start))
    for i in range(c.n_decoder_layers):
        y = decoder_layer(params, f"decoder.layers.{i}", i, y, cache, self_mask, c, nx, rec)
        _rec(rec, f"decoder.layers.{i}.out", y)
    if c.norm_first:
        y = layer_norm(params, "decoder.final_norm", y, c.layer_norm_eps, nx)
    return _rec(rec, "logits", output_logits(params, _rec(rec, "decoder.out", y), nx))


def forward(params: Params, src: np.ndarray, tgt_in: np.ndarray, c: Config, nx: Numerics,
            rec: Record = None) -> np.ndarray:
    """Teacher-forced forward: src (B, S), tgt_in (B, T) -> logits (B, T, V).

    Raises:
        ValueError: from ``spec.validate.check_forward``.
    """
    validate.check_forward(src, tgt_in, c)
    memory = encode(params, src, c, nx, rec)
    return decode(params, tgt_in, init_cache(params, memory, src, c, nx), c, nx, rec)


# ----------------------------------------------------------------- layers alone

def run_layer(layer: str, params: Params, prefix: str, inputs: dict[str, np.ndarray], c: Config,
              nx: Numerics) -> dict[str, np.ndarray]:
    """One layer of ``spec.shapes.LAYERS`` alone, with the parameters under ``prefix``.

    ``add_norm`` is the paper's post-LN ``LayerNorm(x + y)`` with the norm
    ``prefix``; ``positional_encoding`` returns the fp32 table for ``c.max_len``.
    """
    i = inputs
    if layer == "positional_encoding":
        return {"pe": nx.acc(positional_encoding(c.max_len, c.d_model))}
    if layer == "embedding":
        return {"x": embed(params, i["ids"], c, nx)}
    if layer == "scaled_dot_product_attention":
        return {"out": scaled_dot_product_attention(i["q"], i["k"], i["v"], i["mask"], nx)}
    if layer == "multi_head_attention":
        return {"out": multi_head_attention(params, prefix, i["x_q"], i["x_kv"], i["mask"], nx)}
    if layer == "add_norm":
        return {"out": layer_norm(params, prefix, nx.act(i["x"] + i["y"]), c.layer_norm_eps, nx)}
    if layer == "feed_forward":
        return {"out": feed_forward(params, prefix, i["x"], nx)}
    if layer == "encoder_layer":
        return {"out": encoder_layer(params, prefix, i["x"], i["mask"], c, nx, None)}
    if layer == "decoder_layer":
        B, H = i["y"].shape[0], c.n_heads
        kv = attention_kv(params, f"{prefix}.cross_attn", i["memory"], nx)
        empty = (np.zeros((B, 0, H, c.d_k)), np.zeros((B, 0, H, c.d_v)))
        cache = Cache([kv], i["memory_mask"], [empty], np.zeros((B, 0), bool))
        return {"out": decoder_layer(params, prefix, 0, i["y"], cache, i["self_mask"], c, nx, None)}
    if layer == "output_projection":
        return {"logits": output_logits(params, i["h"], nx)}
    raise ValueError(f"unknown layer {layer!r}")
