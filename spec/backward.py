"""The float64 gradient of the training loss: hand-written vector-Jacobian products of every layer.

Shares no code with any framework and none with ``spec.reference``'s forward: each function below recomputes its
layer in float64 (exact mode, never rounding) and returns ``(output, back)``, where ``back(d_output)`` adds the
parameters' gradients into ``grads`` and returns the gradients of the layer's inputs. ``spec/tests`` checks the
result against central finite differences of ``spec.reference.forward`` and ``spec.training``'s loss.

Masked attention scores are constants (``MASKED_SCORE``), so no gradient flows through them; dropout is off
(every value check runs without it).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from spec import reference as ref
from spec import training, validate
from spec.config import Config
from spec.numerics import MASKED_SCORE

Params = dict[str, np.ndarray]
Back = Callable[..., object]


def embed(P: Params, grads: Params, ids: np.ndarray, c: Config) -> tuple[np.ndarray, Back]:
    """``E[ids] * sqrt(D) + PE`` (section 3.4, 3.5): (B, L) -> (B, L, D)."""
    scale = np.sqrt(c.d_model)
    x = P["embedding"][ids] * scale + ref.positional_encoding(ids.shape[1], c.d_model)   # (B, L, D)

    def back(dx: np.ndarray) -> None:
        np.add.at(grads["embedding"], ids, dx * scale)
    return x, back


def attention(P: Params, grads: Params, prefix: str, x_q: np.ndarray, x_kv: np.ndarray,
              mask: np.ndarray) -> tuple[np.ndarray, Back]:
    """Multi-head attention (equation 1, section 3.2.2): (B, T, D), (B, S, D) -> (B, T, D)."""
    wq, wk, wv, wo = (P[f"{prefix}.{n}"] for n in ("w_q", "w_k", "w_v", "w_o"))
    scale = 1.0 / np.sqrt(wq.shape[-1])
    q = np.einsum("btd,dhk->bthk", x_q, wq)                                   # (B, T, H, K)
    k = np.einsum("bsd,dhk->bshk", x_kv, wk)                                  # (B, S, H, K)
    v = np.einsum("bsd,dhc->bshc", x_kv, wv)                                  # (B, S, H, C)
    scores = np.where(mask, np.einsum("bthk,bshk->bhts", q, k) * scale, MASKED_SCORE)  # (B, H, T, S)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)                                     # (B, H, T, S)
    o = np.einsum("bhts,bshc->bthc", probs, v)                                # (B, T, H, C)
    out = np.einsum("bthc,hcd->btd", o, wo)                                   # (B, T, D)

    def back(dout: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        grads[f"{prefix}.w_o"] += np.einsum("bthc,btd->hcd", o, dout)
        do = np.einsum("btd,hcd->bthc", dout, wo)                             # (B, T, H, C)
        dprobs = np.einsum("bthc,bshc->bhts", do, v)                          # (B, H, T, S)
        dv = np.einsum("bhts,bthc->bshc", probs, do)                          # (B, S, H, C)
        dscores = probs * (dprobs - (dprobs * probs).sum(-1, keepdims=True))  # softmax's Jacobian
        dscores = np.where(mask, dscores, 0.0) * scale
        dq = np.einsum("bhts,bshk->bthk", dscores, k)                         # (B, T, H, K)
        dk = np.einsum("bhts,bthk->bshk", dscores, q)                         # (B, S, H, K)
        grads[f"{prefix}.w_q"] += np.einsum("btd,bthk->dhk", x_q, dq)
        grads[f"{prefix}.w_k"] += np.einsum("bsd,bshk->dhk", x_kv, dk)
        grads[f"{prefix}.w_v"] += np.einsum("bsd,bshc->dhc", x_kv, dv)
        dx_q = np.einsum("bthk,dhk->btd", dq, wq)
        dx_kv = np.einsum("bshk,dhk->bsd", dk, wk) + np.einsum("bshc,dhc->bsd", dv, wv)
        return dx_q, dx_kv
    return out, back


def feed_forward(P: Params, grads: Params, prefix: str, x: np.ndarray) -> tuple[np.ndarray, Back]:
    """``max(0, x W_1 + b_1) W_2 + b_2`` (equation 2): (B, L, D) -> (B, L, D)."""
    w1, b1, w2, b2 = (P[f"{prefix}.{n}"] for n in ("w_1", "b_1", "w_2", "b_2"))
    h = x @ w1 + b1                                                           # (B, L, F)
    a = np.maximum(h, 0.0)

    def back(dy: np.ndarray) -> np.ndarray:
        grads[f"{prefix}.w_2"] += np.einsum("blf,bld->fd", a, dy)
        grads[f"{prefix}.b_2"] += dy.sum((0, 1))
        dh = (dy @ w2.T) * (h > 0)                                            # (B, L, F); ReLU'(0) = 0
        grads[f"{prefix}.w_1"] += np.einsum("bld,blf->df", x, dh)
        grads[f"{prefix}.b_1"] += dh.sum((0, 1))
        return dh @ w1.T
    return a @ w2 + b2, back


def layer_norm(P: Params, grads: Params, prefix: str, x: np.ndarray, eps: float) -> tuple[np.ndarray, Back]:
    """LayerNorm over D with ``scale`` and ``bias``: (B, L, D) -> (B, L, D)."""
    mu = x.mean(-1, keepdims=True)
    inv_sigma = 1.0 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)   # (B, L, 1)
    xhat = (x - mu) * inv_sigma

    def back(dy: np.ndarray) -> np.ndarray:
        grads[f"{prefix}.scale"] += (dy * xhat).sum((0, 1))
        grads[f"{prefix}.bias"] += dy.sum((0, 1))
        dxhat = dy * P[f"{prefix}.scale"]
        return inv_sigma * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return xhat * P[f"{prefix}.scale"] + P[f"{prefix}.bias"], back


def sublayer(P: Params, grads: Params, prefix: str, name: str, x: np.ndarray, f: Callable, c: Config
             ) -> tuple[np.ndarray, Back]:
    """Post-LN ``LayerNorm(x + f(x))`` or pre-LN ``x + f(LayerNorm(x))`` (section 5.4); ``f(h) -> (y, back)``,
    whose ``back`` returns dh."""
    norm = f"{prefix}.{name}_norm"
    if c.norm_first:
        h, norm_back = layer_norm(P, grads, norm, x, c.layer_norm_eps)
        y, f_back = f(h)
        return x + y, lambda dout: dout + norm_back(f_back(dout))
    y, f_back = f(x)
    out, norm_back = layer_norm(P, grads, norm, x + y, c.layer_norm_eps)

    def back(dout: np.ndarray) -> np.ndarray:
        ds = norm_back(dout)
        return ds + f_back(ds)
    return out, back


def self_attention(P: Params, grads: Params, prefix: str, mask: np.ndarray) -> Callable:
    """``f`` for ``sublayer``: attention of h over itself; its back returns dh = dx_q + dx_kv."""
    def f(h: np.ndarray) -> tuple[np.ndarray, Back]:
        y, back = attention(P, grads, prefix, h, h, mask)
        return y, lambda dy: sum(back(dy))
    return f


def ffn(P: Params, grads: Params, prefix: str) -> Callable:
    return lambda h: feed_forward(P, grads, prefix, h)


def encoder(P: Params, grads: Params, src: np.ndarray, c: Config) -> tuple[np.ndarray, Back]:
    """Encoder stack (section 3.1): src (B, S) -> memory (B, S, D)."""
    mask = (src != c.pad_id)[:, None, None, :]                                # (B, 1, 1, S)
    x, embed_back = embed(P, grads, src, c)
    backs = [embed_back]
    for i in range(c.n_encoder_layers):
        p = f"encoder.layers.{i}"
        x, b1 = sublayer(P, grads, p, "self_attn", x, self_attention(P, grads, f"{p}.self_attn", mask), c)
        x, b2 = sublayer(P, grads, p, "ffn", x, ffn(P, grads, f"{p}.ffn"), c)
        backs += [b1, b2]
    if c.norm_first:
        x, b = layer_norm(P, grads, "encoder.final_norm", x, c.layer_norm_eps)
        backs.append(b)
    return x, _chain(backs)


def decoder(P: Params, grads: Params, tgt_in: np.ndarray, memory: np.ndarray, src: np.ndarray, c: Config
            ) -> tuple[np.ndarray, Callable]:
    """Decoder stack and tied output projection, teacher-forced: -> (logits (B, T, V), back(dlogits) -> dmemory)."""
    T = tgt_in.shape[1]
    self_mask = np.tril(np.ones((T, T), bool))[None, None] & (tgt_in != c.pad_id)[:, None, None, :]  # (B,1,T,T)
    memory_mask = (src != c.pad_id)[:, None, None, :]                        # (B, 1, 1, S)
    dmemory = np.zeros_like(memory)
    y, embed_back = embed(P, grads, tgt_in, c)
    backs = [embed_back]
    for i in range(c.n_decoder_layers):
        p = f"decoder.layers.{i}"
        y, b1 = sublayer(P, grads, p, "self_attn", y, self_attention(P, grads, f"{p}.self_attn", self_mask), c)
        y, b2 = sublayer(P, grads, p, "cross_attn", y, _cross(P, grads, f"{p}.cross_attn", memory, memory_mask,
                                                              dmemory), c)
        y, b3 = sublayer(P, grads, p, "ffn", y, ffn(P, grads, f"{p}.ffn"), c)
        backs += [b1, b2, b3]
    if c.norm_first:
        y, b = layer_norm(P, grads, "decoder.final_norm", y, c.layer_norm_eps)
        backs.append(b)
    logits = np.einsum("btd,vd->btv", y, P["embedding"])                      # (B, T, V), tied (section 3.4)
    stack_back = _chain(backs)

    def back(dlogits: np.ndarray) -> np.ndarray:
        grads["embedding"] += np.einsum("btv,btd->vd", dlogits, y)
        stack_back(np.einsum("btv,vd->btd", dlogits, P["embedding"]))
        return dmemory
    return logits, back


def _cross(P: Params, grads: Params, prefix: str, memory: np.ndarray, memory_mask: np.ndarray,
           dmemory: np.ndarray) -> Callable:
    """``f`` for ``sublayer``: attention over the encoder output; accumulates d memory into ``dmemory``."""
    def f(h: np.ndarray) -> tuple[np.ndarray, Back]:
        y, back = attention(P, grads, prefix, h, memory, memory_mask)

        def f_back(dy: np.ndarray) -> np.ndarray:
            dh, dmem = back(dy)
            dmemory[...] += dmem
            return dh
        return y, f_back
    return f


def _chain(backs: list[Back]) -> Back:
    """The backward of a sequence of layers: each back in reverse order, feeding the next one's input gradient."""
    def back(d: np.ndarray) -> None:
        for b in reversed(backs):
            d = b(d)
    return back


def loss_and_gradients(params: dict[str, np.ndarray], src: np.ndarray, tgt_in: np.ndarray, tgt_out: np.ndarray,
                       c: Config, label_smoothing: float = 0.1) -> tuple[float, Params]:
    """The training loss (``spec.training``) and its gradient with respect to every parameter, float64.

    ``params`` canonical (``spec.schema``); they enter as ``spec.reference.as_float64`` casts them (rule 0: the
    model of a bf16 config has bf16-rounded weights, whose gradient is the master weights' gradient). src (B, S),
    tgt_in and tgt_out (B, T) int. Returns (loss, {name: gradient float64 of the parameter's shape}).

    Raises:
        ValueError: from ``spec.validate.check_forward``, or if tgt_out's shape differs from tgt_in's.
    """
    src, tgt_in, tgt_out = np.asarray(src), np.asarray(tgt_in), np.asarray(tgt_out)
    validate.check_forward(src, tgt_in, c)
    validate.check_tokens("tgt_out", tgt_out, c)
    if tgt_out.shape != tgt_in.shape:
        raise ValueError(f"tgt_out: shape {tgt_out.shape} differs from tgt_in's {tgt_in.shape}")
    P = ref.as_float64(params, c)
    grads = {k: np.zeros_like(v) for k, v in P.items()}
    memory, encoder_back = encoder(P, grads, src, c)
    logits, decoder_back = decoder(P, grads, tgt_in, memory, src, c)
    loss = training.label_smoothed_cross_entropy(logits, tgt_out, c, label_smoothing)
    encoder_back(decoder_back(training.loss_gradient(logits, tgt_out, c, label_smoothing)))
    return loss, grads
