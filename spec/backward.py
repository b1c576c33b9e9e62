"""The gradient of the training loss: hand-written vector-Jacobian products of every layer, exact or faithful.

Shares no code with any framework and none with ``spec.reference``'s forward: each function here and in
``spec.backward_layers`` (one per layer) recomputes its layer or stack and returns ``(output, back)``, where
``back(d_output)`` adds the parameters' gradients into ``grads`` and returns the gradients of its inputs.
``spec/tests`` checks the exact result against central finite differences of ``spec.reference.forward`` and
``spec.training``'s loss, and the faithful forward against ``spec.reference``'s faithful forward bit for bit.

Numerics (``nx``, a ``spec.numerics.Numerics``). ``Numerics("exact")`` (the default) computes in float64 and never
rounds: the float64 gradient every golden case stores. ``Numerics("float32")`` and ``Numerics("bfloat16")`` model
the *ideal* ("faithful") backward of a backend following ``spec.numerics``, the yardstick the training tolerance
policy (``spec.tolerance.judge_gradient``, ``judge_update``) measures backends against, as the faithful forward is
for the forward:

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
  Element-wise VJPs (ReLU's mask, a smooth activation's derivative, the softmax and LayerNorm Jacobians) run exact
  on their rounded inputs and round their output once: the fused kernel at its best. A bias's gradient is its
  output cotangent summed over batch and positions.
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

from spec import backward_layers as layers
from spec import reference as ref
from spec import training, validate
from spec.config import Config
from spec.numerics import Numerics

Params = dict[str, np.ndarray]
Back = Callable[..., object]
EXACT = Numerics("exact")


def sublayer(P: Params, grads: Params, prefix: str, name: str, x: np.ndarray, f: Callable, c: Config,
             nx: Numerics = EXACT) -> tuple[np.ndarray, Back]:
    """Post-LN ``LayerNorm(x + f(x))`` or pre-LN ``x + f(LayerNorm(x))`` (section 5.4); ``f(h) -> (y, back)``,
    whose ``back`` returns dh. The residual sum is rounded (rule 5); so is x's cotangent, the sum of its two uses'."""
    norm = f"{prefix}.{name}_norm"
    if c.norm_first:
        h, norm_back = layers.layer_norm(P, grads, norm, x, c.layer_norm_eps, nx)
        y, f_back = f(h)
        return nx.act(x + y), lambda dout: nx.act(dout + norm_back(f_back(dout)))
    y, f_back = f(x)
    out, norm_back = layers.layer_norm(P, grads, norm, nx.act(x + y), c.layer_norm_eps, nx)

    def back(dout: np.ndarray) -> np.ndarray:
        ds = norm_back(dout)
        return nx.act(ds + f_back(ds))
    return out, back


def self_attention(P: Params, grads: Params, prefix: str, mask: np.ndarray, nx: Numerics = EXACT) -> Callable:
    """``f`` for ``sublayer``: attention of h over itself; its back returns dh = dx_q + dx_kv (rounded)."""
    def f(h: np.ndarray) -> tuple[np.ndarray, Back]:
        y, back = layers.attention(P, grads, prefix, h, h, mask, nx)
        return y, lambda dy: nx.act(sum(back(dy)))
    return f


def ffn(P: Params, grads: Params, prefix: str, act: str, nx: Numerics = EXACT) -> Callable:
    return lambda h: layers.feed_forward(P, grads, prefix, h, act, nx)


def encoder(P: Params, grads: Params, src: np.ndarray, c: Config, nx: Numerics = EXACT) -> tuple[np.ndarray, Back]:
    """Encoder stack (section 3.1): src (B, S) -> memory (B, S, D)."""
    mask = (src != c.pad_id)[:, None, None, :]                                # (B, 1, 1, S)
    x, embed_back = layers.embed(P, grads, src, c, nx)
    backs = [embed_back]
    for i in range(c.n_encoder_layers):
        p = f"encoder.layers.{i}"
        x, b1 = sublayer(P, grads, p, "self_attn", x, self_attention(P, grads, f"{p}.self_attn", mask, nx), c, nx)
        x, b2 = sublayer(P, grads, p, "ffn", x, ffn(P, grads, f"{p}.ffn", c.activation, nx), c, nx)
        backs += [b1, b2]
    if c.norm_first:
        x, b = layers.layer_norm(P, grads, "encoder.final_norm", x, c.layer_norm_eps, nx)
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
    y, embed_back = layers.embed(P, grads, tgt_in, c, nx)
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
        y, b3 = sublayer(P, grads, p, "ffn", y, ffn(P, grads, f"{p}.ffn", c.activation, nx), c, nx)
        backs.append(b3)
    if c.norm_first:
        y, b = layers.layer_norm(P, grads, "decoder.final_norm", y, c.layer_norm_eps, nx)
        backs.append(b)
    logits = nx.acc(np.einsum("btd,vd->btv", y, P["embedding"]) + P.get("logits_bias", 0.0))  # (B, T, V) fp32, tied
    stack_back = _chain(backs)

    def back(dlogits: np.ndarray) -> np.ndarray:
        layers.accumulate(grads, "embedding", np.einsum("btv,btd->vd", dlogits, y), nx)
        if c.logits_bias:
            layers.accumulate(grads, "logits_bias", dlogits.sum((0, 1)), nx)
        stack_back(nx.act(np.einsum("btv,vd->btd", dlogits, P["embedding"])))
        return dmemory
    return logits, back


def _cross(P: Params, grads: Params, prefix: str, memory: np.ndarray, memory_mask: np.ndarray,
           dmemory: np.ndarray, nx: Numerics = EXACT) -> Callable:
    """``f`` for ``sublayer``: attention over the encoder output; accumulates d memory into ``dmemory``."""
    def f(h: np.ndarray) -> tuple[np.ndarray, Back]:
        y, back = layers.attention(P, grads, prefix, h, memory, memory_mask, nx)

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
        ValueError: from ``spec.validate.check_forward``, if tgt_out's shape differs from tgt_in's, or if ``nx`` is
            a faithful mode other than ``c.dtype`` (a bf16 backward of an fp32 forward models nothing).
    """
    return gradients_at(ref.as_float64(params, c), src, tgt_in, tgt_out, c, label_smoothing, nx)


def gradients_at(P: Params, src: np.ndarray, tgt_in: np.ndarray, tgt_out: np.ndarray, c: Config,
                 label_smoothing: float = 0.1, nx: Numerics = EXACT) -> tuple[float, Params]:
    """``loss_and_gradients`` at weights ``P`` as they enter the computation, float64 arrays used as given.

    For training trajectories in float64 (``spec.golden_training``): weights after an exact Adam step are not fp32
    values, and ``as_float64`` would round them to ``c.dtype``. Same arguments, result and errors otherwise; with
    a decoder-only config ``src`` is None and tgt_in is the model's input tokens.
    """
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

