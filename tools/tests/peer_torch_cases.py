"""What the stock peer's tests share: configs, batches, the copy task and a NumPy float64 reading of its weights."""

from __future__ import annotations

import numpy as np
import torch

import spec
from spec import training
from tools import peer_torch as P

torch.set_num_threads(1)

# tiny, with heads d_model / n_heads = 8 wide (nn.Transformer's only kind), fp32 unless a test says otherwise.
CONFIG = spec.preset("tiny", d_k=8, d_v=8, dtype="float32", param_dtype="float32")
COPY = CONFIG.replace(vocab_size=16, max_len=64, dropout=0.0)
COPY_TRAIN = training.TrainConfig(warmup_steps=50, lr_scale=0.5, label_smoothing=0.0)


def batch(c, rng, B=6, S=7, T=5):
    """A padded batch: src (B, S) rows ending in EOS then pad, tgt_in (B, T) from BOS, tgt_out (B, T)."""
    src = np.zeros((B, S), np.int64)
    tgt_in = np.zeros((B, T), np.int64)
    tgt_out = np.zeros((B, T), np.int64)
    for b in range(B):
        n = rng.integers(1, S)
        src[b, :n] = rng.integers(3, c.vocab_size, n)
        src[b, n] = c.eos_id
        m = rng.integers(1, T + 1)
        words = rng.integers(3, c.vocab_size, m)
        tgt_in[b, 0], tgt_in[b, 1:m] = c.bos_id, words[:m - 1]
        tgt_out[b, :m] = np.append(words[:m - 1], c.eos_id)
    return src, tgt_in, tgt_out


def copy_batch(rng, B):
    """src = random ids (3..V-1, length 2..8) + EOS, right-padded; the target the same ids."""
    c = COPY
    lengths = rng.integers(2, 9, B)
    S = int(lengths.max()) + 1
    src = np.zeros((B, S), np.int64)
    tgt_in, tgt_out = np.zeros((B, S), np.int64), np.zeros((B, S), np.int64)
    for b, n in enumerate(lengths):
        words = rng.integers(3, c.vocab_size, n)
        src[b, :n + 1] = tgt_out[b, :n + 1] = np.append(words, c.eos_id)
        tgt_in[b, :n + 1] = np.append(c.bos_id, words)
    return src, tgt_in, tgt_out


def train_copy(init, steps):
    """A tiny peer trained ``steps`` steps of 32 pairs on the copy task -> (model, losses)."""
    rng = np.random.default_rng(0)
    model = P.Transformer(COPY, seed=0, init=init)
    state = P.init_train_state(model, COPY_TRAIN, seed=0)
    return model, [float(P.train_step(model, state, *copy_batch(rng, 32))[0]) for _ in range(steps)]


def _ln(x, p, name, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * p[f"{name}.weight"] + p[f"{name}.bias"]


def _mha(xq, xkv, p, name, H, masked):
    """nn.MultiheadAttention (packed in_proj): masked (B, Tq, Tk) True where a key is not attended."""
    D = xq.shape[-1]
    w, b = p[f"{name}.in_proj_weight"], p[f"{name}.in_proj_bias"]
    q, k, v = (x @ w[i * D:(i + 1) * D].T + b[i * D:(i + 1) * D] for i, x in enumerate((xq, xkv, xkv)))
    split = lambda t: t.reshape(*t.shape[:2], H, D // H).transpose(0, 2, 1, 3)  # noqa: E731  (B, H, L, hd)
    s = split(q) @ split(k).transpose(0, 1, 3, 2) / np.sqrt(D // H)            # (B, H, Tq, Tk)
    s = np.where(masked[:, None], -np.inf, s)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    o = (a @ split(v)).transpose(0, 2, 1, 3).reshape(xq.shape)
    return o @ p[f"{name}.out_proj.weight"].T + p[f"{name}.out_proj.bias"]


def _ff(x, p, name):
    h = np.maximum(x @ p[f"{name}.linear1.weight"].T + p[f"{name}.linear1.bias"], 0.0)
    return h @ p[f"{name}.linear2.weight"].T + p[f"{name}.linear2.bias"]


def reference_logits(c, params, src, tgt_in):
    """Post-LN nn.Transformer (with its final LayerNorm on each stack) in float64: -> logits (B, T, V)."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    E, H, eps = p["embedding.weight"], c.n_heads, c.layer_norm_eps
    pe = P.positional_encoding(c.max_len, c.d_model).double().numpy()
    embed = lambda ids: E[ids] * np.sqrt(c.d_model) + pe[:ids.shape[1]]  # noqa: E731
    S, T = src.shape[1], tgt_in.shape[1]
    src_masked = np.broadcast_to((src == c.pad_id)[:, None, :], (len(src), S, S))
    x = embed(src)
    for i in range(c.n_encoder_layers):
        n = f"transformer.encoder.layers.{i}"
        x = _ln(x + _mha(x, x, p, f"{n}.self_attn", H, src_masked), p, f"{n}.norm1", eps)
        x = _ln(x + _ff(x, p, n), p, f"{n}.norm2", eps)
    memory = _ln(x, p, "transformer.encoder.norm", eps)
    self_masked = np.triu(np.ones((T, T), bool), 1)[None] | (tgt_in == c.pad_id)[:, None, :]
    cross_masked = np.broadcast_to((src == c.pad_id)[:, None, :], (len(src), T, S))
    y = embed(tgt_in)
    for i in range(c.n_decoder_layers):
        n = f"transformer.decoder.layers.{i}"
        y = _ln(y + _mha(y, y, p, f"{n}.self_attn", H, self_masked), p, f"{n}.norm1", eps)
        y = _ln(y + _mha(y, memory, p, f"{n}.multihead_attn", H, cross_masked), p, f"{n}.norm2", eps)
        y = _ln(y + _ff(y, p, n), p, f"{n}.norm3", eps)
    return _ln(y, p, "transformer.decoder.norm", eps) @ E.T
