"""The vector-Jacobian products of the Transformer's layers, for ``spec.backward`` (its docstring says how each
rounds): each function recomputes its layer and returns ``(output, back)``, where ``back(d_output)`` adds the
parameters' gradients into ``grads`` and returns the gradients of the layer's inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from spec import reference as ref
from spec.config import Config
from spec.numerics import MASKED_SCORE, Numerics

Params = dict[str, np.ndarray]
Back = Callable[..., object]
EXACT = Numerics("exact")


def accumulate(grads: Params, name: str, contribution: np.ndarray, nx: Numerics) -> None:
    """``grads[name] += contribution``, the contribution and the sum rounded to fp32 (parameter gradients are
    fp32); in exact mode the float64 sum itself."""
    grads[name] = nx.acc(grads[name] + nx.acc(contribution))


def embed(P: Params, grads: Params, ids: np.ndarray, c: Config, nx: Numerics = EXACT) -> tuple[np.ndarray, Back]:
    """``E[ids] * sqrt(D) + PE`` (section 3.4, 3.5), rounded once (rule 3): (B, L) -> (B, L, D); the factor 1
    without ``c.scale_embedding``, PE the ``position_embedding`` rows with ``c.positions="learned"``."""
    L = ids.shape[1]
    scale = nx.acc(np.sqrt(c.d_model)) if c.scale_embedding else 1.0
    learned = c.positions == "learned"
    pe = P["position_embedding"][:L] if learned else nx.acc(
        ref.layers.positional_encoding(L, c.d_model, c.positions == "sinusoidal_halves"))   # (L, D)
    x = nx.act(P["embedding"][ids] * scale + pe)                              # (B, L, D)

    def back(dx: np.ndarray) -> None:
        if learned:
            rows = np.zeros_like(grads["position_embedding"])                 # (max_len, D)
            rows[:L] = dx.sum(0)
            accumulate(grads, "position_embedding", rows, nx)
        if nx.mode == "exact":  # scattered straight into the running sum: the float64 path's historical order
            np.add.at(grads["embedding"], ids, dx * scale)
            return
        rows = np.zeros_like(grads["embedding"])                              # (V, D)
        np.add.at(rows, ids, dx * scale)
        accumulate(grads, "embedding", rows, nx)
    return x, back


def attention(P: Params, grads: Params, prefix: str, x_q: np.ndarray, x_kv: np.ndarray,
              mask: np.ndarray, nx: Numerics = EXACT) -> tuple[np.ndarray, Back]:
    """Multi-head attention (equation 1, section 3.2.2; rule 4): (B, T, D), (B, S, D) -> (B, T, D)."""
    wq, wk, wv, wo = (P[f"{prefix}.{n}"] for n in ("w_q", "w_k", "w_v", "w_o"))
    bias = {n: P.get(f"{prefix}.{n}", 0.0) for n in ("b_q", "b_k", "b_v", "b_o")}  # config.attention_bias, else 0
    scale = nx.acc(1.0 / np.sqrt(wq.shape[-1]))
    q = nx.act(np.einsum("btd,dhk->bthk", x_q, wq) + bias["b_q"])           # (B, T, H, K)
    k = nx.act(np.einsum("bsd,dhk->bshk", x_kv, wk) + bias["b_k"])          # (B, S, H, K)
    v = nx.act(np.einsum("bsd,dhc->bshc", x_kv, wv) + bias["b_v"])          # (B, S, H, C)
    scores = nx.acc(nx.acc(np.einsum("bthk,bshk->bhts", q, k)) * scale)      # (B, H, T, S) fp32
    scores = np.where(mask, scores, MASKED_SCORE)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    probs = nx.acc(probs)                                                     # (B, H, T, S) fp32 softmax output
    probs_act = nx.act(probs)                                                 # rounded before P V
    o = nx.act(np.einsum("bhts,bshc->bthc", probs_act, v))                   # (B, T, H, C)
    out = nx.act(np.einsum("bthc,hcd->btd", o, wo) + bias["b_o"])           # (B, T, D)

    def back(dout: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        accumulate(grads, f"{prefix}.w_o", np.einsum("bthc,btd->hcd", o, dout), nx)
        do = nx.act(np.einsum("btd,hcd->bthc", dout, wo))                     # (B, T, H, C)
        dprobs = nx.act(np.einsum("bthc,bshc->bhts", do, v))                  # (B, H, T, S)
        dv = nx.act(np.einsum("bhts,bthc->bshc", probs_act, do))              # (B, S, H, C)
        dscores = probs * (dprobs - (dprobs * probs).sum(-1, keepdims=True))  # softmax's Jacobian, fp32 out
        dscores = nx.acc(nx.acc(np.where(mask, nx.acc(dscores), 0.0)) * scale)
        dq = nx.act(np.einsum("bhts,bshk->bthk", dscores, k))                 # (B, T, H, K)
        dk = nx.act(np.einsum("bhts,bthk->bshk", dscores, q))                 # (B, S, H, K)
        accumulate(grads, f"{prefix}.w_q", np.einsum("btd,bthk->dhk", x_q, dq), nx)
        accumulate(grads, f"{prefix}.w_k", np.einsum("bsd,bshk->dhk", x_kv, dk), nx)
        accumulate(grads, f"{prefix}.w_v", np.einsum("bsd,bshc->dhc", x_kv, dv), nx)
        if f"{prefix}.b_q" in P:
            # A key bias adds q . b_k to all of a query's scores, which the softmax ignores: its exact gradient is
            # zero, and the sum of dk only cancellation residue, whose bits vary with the CPU's float64 kernels. A
            # rounding backward keeps its sum: the residue a backend computes.
            db_k = np.zeros(dk.shape[2:]) if nx.mode == "exact" else dk.sum((0, 1))
            for name, d in (("b_q", dq.sum((0, 1))), ("b_k", db_k), ("b_v", dv.sum((0, 1))), ("b_o", dout.sum((0, 1)))):
                accumulate(grads, f"{prefix}.{name}", d, nx)
        dx_q = nx.act(np.einsum("bthk,dhk->btd", dq, wq))
        dx_kv = nx.act(nx.act(np.einsum("bshk,dhk->bsd", dk, wk)) + nx.act(np.einsum("bshc,dhc->bsd", dv, wv)))
        return dx_q, dx_kv
    return out, back


def feed_forward(P: Params, grads: Params, prefix: str, x: np.ndarray, act: str = "relu", nx: Numerics = EXACT
                 ) -> tuple[np.ndarray, Back]:
    """``act(x W_1 + b_1) W_2 + b_2`` (equation 2; ``act`` the config's activation): (B, L, D) -> (B, L, D)."""
    w1, b1, w2, b2 = (P[f"{prefix}.{n}"] for n in ("w_1", "b_1", "w_2", "b_2"))
    h = nx.act(np.einsum("bld,df->blf", x, w1) + b1)                          # (B, L, F); einsum: see reference
    a = np.maximum(h, 0.0) if act == "relu" else nx.act(activation(h, act)[0])

    def back(dy: np.ndarray) -> np.ndarray:
        accumulate(grads, f"{prefix}.w_2", np.einsum("blf,bld->fd", a, dy), nx)
        accumulate(grads, f"{prefix}.b_2", dy.sum((0, 1)), nx)
        da = nx.act(np.einsum("bld,fd->blf", dy, w2))                         # (B, L, F)
        dh = da * (h > 0) if act == "relu" else nx.act(da * activation(h, act)[1])   # ReLU'(0) = 0
        accumulate(grads, f"{prefix}.w_1", np.einsum("bld,blf->df", x, dh), nx)
        accumulate(grads, f"{prefix}.b_1", dh.sum((0, 1)), nx)
        return nx.act(np.einsum("blf,df->bld", dh, w1))
    return nx.act(np.einsum("blf,fd->bld", a, w2) + b2), back


def activation(h: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A smooth activation of ``spec.config.ACTIVATIONS`` and its derivative at h, exact (float64); the value by
    ``spec.reference.layers.activation``'s expression, so that the faithful forwards agree bit for bit."""
    if name == "gelu":                                                        # x Phi(x): Phi + x phi
        erf = _erf(h / np.sqrt(2.0))
        return 0.5 * h * (1.0 + erf), 0.5 * (1.0 + erf) + h * np.exp(-0.5 * h * h) / np.sqrt(2.0 * np.pi)
    if name == "gelu_tanh":
        c = np.sqrt(2.0 / np.pi)
        t = np.tanh(c * (h + 0.044715 * h**3))
        return 0.5 * h * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * h * h)
    if name == "silu":                                                        # x s(x): s (1 + x (1 - s))
        sig = 1.0 / (1.0 + np.exp(-h))
        return h / (1.0 + np.exp(-h)), sig * (1.0 + h * (1.0 - sig))
    raise ValueError(f"unknown activation {name!r}")


_erf = np.vectorize(math.erf, otypes=[np.float64])


def layer_norm(P: Params, grads: Params, prefix: str, x: np.ndarray, eps: float, nx: Numerics = EXACT
               ) -> tuple[np.ndarray, Back]:
    """LayerNorm over D with ``scale`` and ``bias``, fp32 inside, output rounded (rule 6): (B, L, D) -> (B, L, D)."""
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)                             # (B, L, 1)
    inv_sigma = 1.0 / np.sqrt(var + eps)
    xhat = (x - mu) * inv_sigma
    # The faithful forward rounds spec.reference's own float64 expression, so the two agree bit for bit; exact
    # mode keeps its historical one.
    y = xhat * P[f"{prefix}.scale"] if nx.mode == "exact" else (x - mu) / np.sqrt(var + eps) * P[f"{prefix}.scale"]

    def back(dy: np.ndarray) -> np.ndarray:
        accumulate(grads, f"{prefix}.scale", (dy * xhat).sum((0, 1)), nx)
        accumulate(grads, f"{prefix}.bias", dy.sum((0, 1)), nx)
        dxhat = dy * P[f"{prefix}.scale"]
        return nx.act(inv_sigma * (dxhat - dxhat.mean(-1, keepdims=True)
                                   - xhat * (dxhat * xhat).mean(-1, keepdims=True)))
    return nx.act(y + P[f"{prefix}.bias"]), back
