"""The gradient of the training loss: hand-written vector-Jacobian products of every layer, exact or faithful.

Shares no code with any framework and none with ``spec.reference``'s forward: each function below recomputes its
layer and returns ``(output, back)``, where ``back(d_output)`` adds the parameters' gradients into ``grads`` and
returns the gradients of the layer's inputs. ``spec/tests`` checks the exact result against central finite
differences of ``spec.reference.forward`` and ``spec.training``'s loss, and the faithful forward against
``spec.reference``'s faithful forward bit for bit.

Numerics (``nx``, a ``spec.numerics.Numerics``). ``Numerics("exact")`` (the default) computes in float64 and never
rounds: the float64 gradient every golden case stores. ``Numerics("float32")`` and ``Numerics("bfloat16")`` model
the *ideal* ("faithful") backward of a backend following ``spec.numerics``, the yardstick the gradient tolerance
policy (``spec.tolerance.judge_training``) measures backends against, as the faithful forward is for the forward:

* The forward recomputes the activations rounded exactly where ``spec.reference`` rounds them (same points, same
  ``nx.act``/``nx.acc`` calls), so it is the faithful forward.
* Dtypes of the backward follow autodiff: the cotangent of a value has that value's dtype. Cotangents of
  activations held in ``dtype`` (bf16 in mixed precision: embeddings, Q, K, V, probabilities, head outputs, FFN
  hidden units, sublayer outputs, residual sums, LayerNorm outputs, the final hidden state) are rounded to
  ``dtype`` (``nx.act``); cotangents of fp32 values (logits, attention scores, LayerNorm's internals, the loss) are
  fp32 (``nx.acc``). The cast of a weight from fp32 to bf16 passes its cotangent through.
* Each VJP product is exact and rounded once at its output (what an fp32 accumulator gives at best), as the
  forward's matrix products are. A value used twice (the residual stream, x_kv for K and V, the encoder output in
  every cross-attention) gets each use's cotangent rounded and their sum rounded, as autodiff accumulates them.
  Element-wise VJPs (ReLU's mask, the softmax and LayerNorm Jacobians) run exact on their rounded inputs and round
  their output once: the fused kernel at its best.
* Parameter gradients are fp32 whatever ``dtype`` (mixed precision keeps fp32 master weights, ``spec.training``):
  each use's contribution rounded to fp32 and the running sum rounded to fp32.
* The loss and d loss / d logits are computed exact from the fp32 logits and rounded to fp32 (rule 7).

In float32 mode every rounding above is to fp32: the VJPs computed in float32 arithmetic, once per product.

Masked attention scores are constants (``MASKED_SCORE``), so no gradient flows through them; dropout is off
(every value check runs without it).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from spec import reference as ref
from spec import training, validate
from spec.config import Config
from spec.numerics import MASKED_SCORE, Numerics

Params = dict[str, np.ndarray]
Back = Callable[..., object]
EXACT = Numerics("exact")


def _accumulate(grads: Params, name: str, contribution: np.ndarray, nx: Numerics) -> None:
    """``grads[name] += contribution``, the contribution and the sum rounded to fp32 (parameter gradients are
    fp32); in exact mode the float64 sum itself."""
    grads[name] = nx.acc(grads[name] + nx.acc(contribution))


def embed(P: Params, grads: Params, ids: np.ndarray, c: Config, nx: Numerics = EXACT) -> tuple[np.ndarray, Back]:
    """``E[ids] * sqrt(D) + PE`` (section 3.4, 3.5), rounded once (rule 3): (B, L) -> (B, L, D)."""
    scale = nx.acc(np.sqrt(c.d_model))
    pe = nx.acc(ref.layers.positional_encoding(ids.shape[1], c.d_model))      # (L, D)
    x = nx.act(P["embedding"][ids] * scale + pe)                              # (B, L, D)

    def back(dx: np.ndarray) -> None:
        if nx.mode == "exact":  # scattered straight into the running sum: the float64 path's historical order
            np.add.at(grads["embedding"], ids, dx * scale)
            return
        rows = np.zeros_like(grads["embedding"])                              # (V, D)
        np.add.at(rows, ids, dx * scale)
        _accumulate(grads, "embedding", rows, nx)
    return x, back


def attention(P: Params, grads: Params, prefix: str, x_q: np.ndarray, x_kv: np.ndarray,
              mask: np.ndarray, nx: Numerics = EXACT) -> tuple[np.ndarray, Back]:
    """Multi-head attention (equation 1, section 3.2.2; rule 4): (B, T, D), (B, S, D) -> (B, T, D)."""
    wq, wk, wv, wo = (P[f"{prefix}.{n}"] for n in ("w_q", "w_k", "w_v", "w_o"))
    scale = nx.acc(1.0 / np.sqrt(wq.shape[-1]))
    q = nx.act(np.einsum("btd,dhk->bthk", x_q, wq))                          # (B, T, H, K)
    k = nx.act(np.einsum("bsd,dhk->bshk", x_kv, wk))                         # (B, S, H, K)
    v = nx.act(np.einsum("bsd,dhc->bshc", x_kv, wv))                         # (B, S, H, C)
    scores = nx.acc(nx.acc(np.einsum("bthk,bshk->bhts", q, k)) * scale)      # (B, H, T, S) fp32
    scores = np.where(mask, scores, MASKED_SCORE)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    probs = nx.acc(probs)                                                     # (B, H, T, S) fp32 softmax output
    probs_act = nx.act(probs)                                                 # rounded before P V
    o = nx.act(np.einsum("bhts,bshc->bthc", probs_act, v))                   # (B, T, H, C)
    out = nx.act(np.einsum("bthc,hcd->btd", o, wo))                          # (B, T, D)

    def back(dout: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        _accumulate(grads, f"{prefix}.w_o", np.einsum("bthc,btd->hcd", o, dout), nx)
        do = nx.act(np.einsum("btd,hcd->bthc", dout, wo))                     # (B, T, H, C)
        dprobs = nx.act(np.einsum("bthc,bshc->bhts", do, v))                  # (B, H, T, S)
        dv = nx.act(np.einsum("bhts,bthc->bshc", probs_act, do))              # (B, S, H, C)
        dscores = probs * (dprobs - (dprobs * probs).sum(-1, keepdims=True))  # softmax's Jacobian, fp32 out
        dscores = nx.acc(nx.acc(np.where(mask, nx.acc(dscores), 0.0)) * scale)
        dq = nx.act(np.einsum("bhts,bshk->bthk", dscores, k))                 # (B, T, H, K)
        dk = nx.act(np.einsum("bhts,bthk->bshk", dscores, q))                 # (B, S, H, K)
        _accumulate(grads, f"{prefix}.w_q", np.einsum("btd,bthk->dhk", x_q, dq), nx)
        _accumulate(grads, f"{prefix}.w_k", np.einsum("bsd,bshk->dhk", x_kv, dk), nx)
        _accumulate(grads, f"{prefix}.w_v", np.einsum("bsd,bshc->dhc", x_kv, dv), nx)
        dx_q = nx.act(np.einsum("bthk,dhk->btd", dq, wq))
        dx_kv = nx.act(nx.act(np.einsum("bshk,dhk->bsd", dk, wk)) + nx.act(np.einsum("bshc,dhc->bsd", dv, wv)))
        return dx_q, dx_kv
    return out, back


def feed_forward(P: Params, grads: Params, prefix: str, x: np.ndarray, nx: Numerics = EXACT
                 ) -> tuple[np.ndarray, Back]:
    """``max(0, x W_1 + b_1) W_2 + b_2`` (equation 2): (B, L, D) -> (B, L, D)."""
    w1, b1, w2, b2 = (P[f"{prefix}.{n}"] for n in ("w_1", "b_1", "w_2", "b_2"))
    h = nx.act(np.einsum("bld,df->blf", x, w1) + b1)                          # (B, L, F); einsum: see reference
    a = np.maximum(h, 0.0)

    def back(dy: np.ndarray) -> np.ndarray:
        _accumulate(grads, f"{prefix}.w_2", np.einsum("blf,bld->fd", a, dy), nx)
        _accumulate(grads, f"{prefix}.b_2", dy.sum((0, 1)), nx)
        dh = nx.act(np.einsum("bld,fd->blf", dy, w2)) * (h > 0)               # (B, L, F); ReLU'(0) = 0
        _accumulate(grads, f"{prefix}.w_1", np.einsum("bld,blf->df", x, dh), nx)
        _accumulate(grads, f"{prefix}.b_1", dh.sum((0, 1)), nx)
        return nx.act(np.einsum("blf,df->bld", dh, w1))
    return nx.act(np.einsum("blf,fd->bld", a, w2) + b2), back


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
        _accumulate(grads, f"{prefix}.scale", (dy * xhat).sum((0, 1)), nx)
        _accumulate(grads, f"{prefix}.bias", dy.sum((0, 1)), nx)
        dxhat = dy * P[f"{prefix}.scale"]
        return nx.act(inv_sigma * (dxhat - dxhat.mean(-1, keepdims=True)
                                   - xhat * (dxhat * xhat).mean(-1, keepdims=True)))
    return nx.act(y + P[f"{prefix}.bias"]), back


def sublayer(P: Params, grads: Params, prefix: str, name: str, x: np.ndarray, f: Callable, c: Config,
             nx: Numerics = EXACT) -> tuple[np.ndarray, Back]:
    """Post-LN ``LayerNorm(x + f(x))`` or pre-LN ``x + f(LayerNorm(x))`` (section 5.4); ``f(h) -> (y, back)``,
    whose ``back`` returns dh. The residual sum is rounded (rule 5); so is x's cotangent, the sum of its two uses'."""
    norm = f"{prefix}.{name}_norm"
    if c.norm_first:
        h, norm_back = layer_norm(P, grads, norm, x, c.layer_norm_eps, nx)
        y, f_back = f(h)
        return nx.act(x + y), lambda dout: nx.act(dout + norm_back(f_back(dout)))
    y, f_back = f(x)
    out, norm_back = layer_norm(P, grads, norm, nx.act(x + y), c.layer_norm_eps, nx)

    def back(dout: np.ndarray) -> np.ndarray:
        ds = norm_back(dout)
        return nx.act(ds + f_back(ds))
    return out, back


def self_attention(P: Params, grads: Params, prefix: str, mask: np.ndarray, nx: Numerics = EXACT) -> Callable:
    """``f`` for ``sublayer``: attention of h over itself; its back returns dh = dx_q + dx_kv (rounded)."""
    def f(h: np.ndarray) -> tuple[np.ndarray, Back]:
        y, back = attention(P, grads, prefix, h, h, mask, nx)
        return y, lambda dy: nx.act(sum(back(dy)))
    return f


def ffn(P: Params, grads: Params, prefix: str, nx: Numerics = EXACT) -> Callable:
    return lambda h: feed_forward(P, grads, prefix, h, nx)


def encoder(P: Params, grads: Params, src: np.ndarray, c: Config, nx: Numerics = EXACT) -> tuple[np.ndarray, Back]:
    """Encoder stack (section 3.1): src (B, S) -> memory (B, S, D)."""
    mask = (src != c.pad_id)[:, None, None, :]                                # (B, 1, 1, S)
    x, embed_back = embed(P, grads, src, c, nx)
    backs = [embed_back]
    for i in range(c.n_encoder_layers):
        p = f"encoder.layers.{i}"
        x, b1 = sublayer(P, grads, p, "self_attn", x, self_attention(P, grads, f"{p}.self_attn", mask, nx), c, nx)
        x, b2 = sublayer(P, grads, p, "ffn", x, ffn(P, grads, f"{p}.ffn", nx), c, nx)
        backs += [b1, b2]
    if c.norm_first:
        x, b = layer_norm(P, grads, "encoder.final_norm", x, c.layer_norm_eps, nx)
        backs.append(b)
    return x, _chain(backs)


def decoder(P: Params, grads: Params, tgt_in: np.ndarray, memory: np.ndarray, src: np.ndarray, c: Config,
            nx: Numerics = EXACT) -> tuple[np.ndarray, Callable]:
    """Decoder stack and tied output projection, teacher-forced: -> (logits (B, T, V), back(dlogits) -> dmemory);
    decoder-only (``c.decoder_only``, memory and src None): no cross-attention."""
    T = tgt_in.shape[1]
    self_mask = np.tril(np.ones((T, T), bool))[None, None] & (tgt_in != c.pad_id)[:, None, None, :]  # (B,1,T,T)
    memory_mask = None if src is None else (src != c.pad_id)[:, None, None, :]  # (B, 1, 1, S)
    dmemory = None if memory is None else np.zeros_like(memory)
    y, embed_back = embed(P, grads, tgt_in, c, nx)
    backs = [embed_back]
    for i in range(c.n_decoder_layers):
        p = f"decoder.layers.{i}"
        y, b1 = sublayer(P, grads, p, "self_attn", y,
                         self_attention(P, grads, f"{p}.self_attn", self_mask, nx), c, nx)
        backs.append(b1)
        if not c.decoder_only:
            y, b2 = sublayer(P, grads, p, "cross_attn", y,
                             _cross(P, grads, f"{p}.cross_attn", memory, memory_mask, dmemory, nx), c, nx)
            backs.append(b2)
        y, b3 = sublayer(P, grads, p, "ffn", y, ffn(P, grads, f"{p}.ffn", nx), c, nx)
        backs.append(b3)
    if c.norm_first:
        y, b = layer_norm(P, grads, "decoder.final_norm", y, c.layer_norm_eps, nx)
        backs.append(b)
    logits = nx.acc(np.einsum("btd,vd->btv", y, P["embedding"]))             # (B, T, V) fp32, tied (section 3.4)
    stack_back = _chain(backs)

    def back(dlogits: np.ndarray) -> np.ndarray:
        _accumulate(grads, "embedding", np.einsum("btv,btd->vd", dlogits, y), nx)
        stack_back(nx.act(np.einsum("btv,vd->btd", dlogits, P["embedding"])))
        return dmemory
    return logits, back


def _cross(P: Params, grads: Params, prefix: str, memory: np.ndarray, memory_mask: np.ndarray,
           dmemory: np.ndarray, nx: Numerics = EXACT) -> Callable:
    """``f`` for ``sublayer``: attention over the encoder output; accumulates d memory into ``dmemory``."""
    def f(h: np.ndarray) -> tuple[np.ndarray, Back]:
        y, back = attention(P, grads, prefix, h, memory, memory_mask, nx)

        def f_back(dy: np.ndarray) -> np.ndarray:
            dh, dmem = back(dy)
            dmemory[...] = nx.act(dmemory + dmem)
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
                       c: Config, label_smoothing: float = 0.1, nx: Numerics = EXACT) -> tuple[float, Params]:
    """The training loss (``spec.training``) and its gradient with respect to every parameter.

    ``params`` canonical (``spec.schema``); they enter as ``spec.reference.as_float64`` casts them (rule 0: the
    model of a bf16 config has bf16-rounded weights, whose gradient is the master weights' gradient). src (B, S),
    tgt_in and tgt_out (B, T) int. ``nx`` exact (default: float64) or the faithful mode of ``c.dtype`` (module
    docstring). Returns (loss, {name: gradient of the parameter's shape}), float64 arrays (in a faithful mode
    holding fp32 values).

    Raises:
        ValueError: from ``spec.validate.check_forward`` and ``check_paper_options``, if tgt_out's shape differs from
            tgt_in's, or if ``nx`` is a faithful mode but ``c.dtype`` (a bf16 backward of fp32 models nothing).
    """
    return gradients_at(ref.as_float64(params, c), src, tgt_in, tgt_out, c, label_smoothing, nx)


def gradients_at(P: Params, src: np.ndarray, tgt_in: np.ndarray, tgt_out: np.ndarray, c: Config,
                 label_smoothing: float = 0.1, nx: Numerics = EXACT) -> tuple[float, Params]:
    """``loss_and_gradients`` at weights ``P`` as they enter the computation, float64 arrays used as given.

    For training trajectories in float64 (``spec.golden_training``): weights after an exact Adam step are not fp32
    values, and ``as_float64`` would round them to ``c.dtype``. Same arguments, result and errors otherwise; with
    a decoder-only config ``src`` is None and tgt_in is the model's input tokens.
    """
    validate.check_paper_options(c, "spec.backward")
    src, tgt_in, tgt_out = None if c.decoder_only else np.asarray(src), np.asarray(tgt_in), np.asarray(tgt_out)
    validate.check_tokens("tokens", tgt_in, c) if src is None else validate.check_forward(src, tgt_in, c)
    validate.check_tokens("tgt_out", tgt_out, c)
    if tgt_out.shape != tgt_in.shape:
        raise ValueError(f"tgt_out: shape {tgt_out.shape} differs from tgt_in's {tgt_in.shape}")
    if nx.mode not in ("exact", c.dtype):
        raise ValueError(f"backward: numerics {nx.mode!r} must be 'exact' or the config's dtype {c.dtype!r}")
    grads = {k: np.zeros_like(v) for k, v in P.items()}
    memory, encoder_back = (None, None) if src is None else encoder(P, grads, src, c, nx)
    logits, decoder_back = decoder(P, grads, tgt_in, memory, src, c, nx)
    loss = float(nx.acc(training.label_smoothed_cross_entropy(logits, tgt_out, c, label_smoothing)))
    dlogits = nx.acc(training.loss_gradient(logits, tgt_out, c, label_smoothing))   # (B, T, V) fp32
    dmemory = decoder_back(dlogits)
    if encoder_back is not None:
        encoder_back(dmemory)
    return loss, grads


def lm_loss_and_gradients(params: dict[str, np.ndarray], tokens: np.ndarray, c: Config, label_smoothing: float = 0.0,
                          nx: Numerics = EXACT) -> tuple[float, Params]:
    """Next-token prediction (``spec.api.lm_loss_and_gradients``) with a decoder-only config: the loss of logits
    of ``tokens[:, :-1]`` against ``tokens[:, 1:]`` and its gradient, as ``loss_and_gradients``. Raises
    ``ValueError`` from ``spec.validate.check_model_kind`` and ``check_lm_batch``."""
    validate.check_model_kind(c, decoder_only=True)
    validate.check_lm_batch(tokens := np.asarray(tokens), c)
    return gradients_at(ref.as_float64(params, c), None, tokens[:, :-1], tokens[:, 1:], c, label_smoothing, nx)

