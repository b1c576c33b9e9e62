"""Training as the paper did it (section 5): the label-smoothed loss, Adam with the warmup schedule, dropout; for
the decoder-only model the same on next-token prediction (``lm_loss_and_gradients``, ``lm_train_step``).

The definitions are ``spec.training``'s. The model's own forward computes the logits (the numerics contract as in
evaluation); the loss is computed in fp32 from the float32 logits; gradients are taken with respect to fp32 copies
of the parameters (``torch.func.functional_call``), so they are fp32 whatever ``param_dtype``, and a bf16 rounding
of a weight passes its gradient through unchanged (``numerics.round_to``). Adam is ``torch.optim.adam.adam``'s fused
kernel for fp32 parameters and a few tensor ops for bf16 ones (the kernel would keep bf16 moments for them, which
the spec forbids), over the moments of the train state (``impl_torch.train_state``) rather than a
``torch.optim.Adam``'s: they are canonical (keyed by ``spec.schema`` names), so they save and load in every framework.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.adam import adam

from impl_torch.inputs import Ids, device_ids, host_ids
from impl_torch.lm import LanguageModel
from impl_torch.model import Transformer, TransformerBase
from impl_torch.train_state import TrainState, check_state
from spec import training, validate


def loss_and_gradients(model: Transformer, src: Ids, tgt_in: Ids, tgt_out: Ids, label_smoothing: float = 0.1
                       ) -> tuple[Tensor, dict[str, Tensor]]:
    """The label-smoothed loss of ``spec.training`` (section 5.4) and its gradient: (loss, a 0-d float32 tensor;
    {canonical name: float32 gradient of the parameter's shape} in ``spec.schema`` order), without dropout (as
    ``spec.api``; ``train_step`` draws its dropout from ``state.rng``). For fp32 parameters computing in bf16
    these are the gradients of the fp32 master weights; for bf16 parameters, of their fp32 values.

    The forward runs on fp32 leaves standing in for the parameters (``functional_call``): the same values (a bf16
    parameter's upcast is exact), so the model computes what it always does, while the gradients come out fp32
    and no ``.grad`` is left on the model.

    Raises:
        ValueError: from ``spec.validate.check_train_batch``, before anything is computed.
    """
    src, tgt_in, tgt_out = _batch(model, src, tgt_in, tgt_out)
    return _loss_and_gradients(model, (src, tgt_in), tgt_out, label_smoothing, None)


def train_step(model: Transformer, state: TrainState, src: Ids, tgt_in: Ids, tgt_out: Ids
               ) -> tuple[Tensor, Transformer, TrainState]:
    """One Adam step on one batch with dropout (sections 5.3, 5.4): -> (loss, model, state).

    Dropout at ``config.dropout`` with masks from ``state.rng``; the loss as ``loss_and_gradients`` (label
    smoothing of ``state.train_config``); Adam (``adam_update``). ``model`` and ``state`` are updated in place and
    returned. The loss (0-d float32) is the batch's before the update.

    Raises:
        ValueError: as ``loss_and_gradients``, or if ``state`` was built for another model (parameter names or
            shapes); before anything is computed.
    """
    src, tgt_in, tgt_out = _batch(model, src, tgt_in, tgt_out)
    check_state(model, state)
    loss, grads = _loss_and_gradients(model, (src, tgt_in), tgt_out, state.train_config.label_smoothing, state.rng)
    adam_update(dict(model.named_parameters()), grads, state)
    return loss, model, state


def lm_loss_and_gradients(model: LanguageModel, tokens: Ids, label_smoothing: float = 0.0, *,
                          rng: torch.Generator | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """Next-token prediction: the loss of ``spec.training`` for ``model(tokens[:, :-1])`` against ``tokens[:, 1:]``
    and its gradient, as ``loss_and_gradients`` (fp32 leaves, dropout only from an ``rng``).

    Raises:
        ValueError: from ``spec.validate.check_lm_batch``, before anything is computed.
    """
    tokens = _lm_batch(model, tokens)
    return _loss_and_gradients(model, (tokens[:, :-1],), tokens[:, 1:], label_smoothing, rng)


def lm_train_step(model: LanguageModel, state: TrainState, tokens: Ids) -> tuple[Tensor, LanguageModel, TrainState]:
    """``train_step`` for next-token prediction on tokens (B, T): dropout from ``state.rng``, the loss of
    ``lm_loss_and_gradients`` at ``state.train_config.label_smoothing``, Adam (``adam_update``); ``model`` and
    ``state`` updated in place and returned.

    Raises:
        ValueError: as ``lm_loss_and_gradients``, or if ``state`` was built for another model; before anything is
            computed.
    """
    tokens = _lm_batch(model, tokens)
    check_state(model, state)
    loss, grads = lm_loss_and_gradients(model, tokens, state.train_config.label_smoothing, rng=state.rng)
    adam_update(dict(model.named_parameters()), grads, state)
    return loss, model, state


def smoothed_loss(logits: Tensor, tgt_out: Tensor, label_smoothing: float, pad_id: int, *,
                  count: Tensor | int | None = None) -> Tensor:
    """spec.training's label-smoothed loss (section 5.4) of logits (B, T, V) float32 against tgt_out (B, T) int64
    on their device, in fp32: (1 - eps) NLL + eps mean_v(-log p_v) summed over the non-pad targets and divided by
    ``count`` (the global batch's non-pad targets when this batch is one data-parallel worker's share of it) or,
    if None, by this batch's own: their mean -> () float32."""
    args = (logits.flatten(0, 1), tgt_out.flatten())
    if count is None:
        return F.cross_entropy(*args, ignore_index=pad_id, label_smoothing=label_smoothing)       # () float32
    return F.cross_entropy(*args, ignore_index=pad_id, label_smoothing=label_smoothing, reduction="sum") / count


@torch.no_grad()
def adam_update(params: dict[str, nn.Parameter], grads: dict[str, Tensor], state: TrainState) -> None:
    """Adam (section 5.3) in fp32 as ``spec.training.adam_update``, the learning rate of equation 3 at
    ``state.step + 1``: each of ``params`` ({canonical name: parameter}) written in place, ``state``'s moments
    and step advanced.

    fp32 parameters (fp32 master weights) go through ``torch.optim.adam.adam`` with ``fused=True``, PyTorch's
    one-pass kernel of the same update (epsilon outside the square root); bf16 parameters keep the tensor ops
    below (the fused kernel would hold their moments in bf16). ``docs/decisions-torch.md`` has the timings.
    """
    tc, t = state.train_config, state.step + 1
    lr = training.learning_rate(t, params["embedding"].shape[-1], tc.warmup_steps, tc.lr_scale)
    if all(p.dtype == torch.float32 for p in params.values()):
        steps = [torch.tensor(float(state.step), device=p.device) for p in params.values()]  # the kernel adds 1
        adam(list(params.values()), [grads[n] for n in params], [state.m[n] for n in params],
             [state.v[n] for n in params], [], steps, fused=True, amsgrad=False, beta1=tc.beta1, beta2=tc.beta2,
             lr=lr, weight_decay=0.0, eps=tc.adam_eps, maximize=False)
        torch.autograd.graph.increment_version(list(params.values()))  # the kernel leaves the versions as they were
    else:
        for name, p in params.items():
            g, m, v = grads[name], state.m[name], state.v[name]                          # fp32, p's shape
            m.mul_(tc.beta1).add_(g, alpha=1.0 - tc.beta1)
            v.mul_(tc.beta2).addcmul_(g, g, value=1.0 - tc.beta2)
            step = (m / (1.0 - tc.beta1 ** t)) / ((v / (1.0 - tc.beta2 ** t)).sqrt() + tc.adam_eps)  # fp32
            p.copy_(p.float() - lr * step)                                               # rounded to bf16
    state.step = t


def _batch(model: Transformer, src: Ids, tgt_in: Ids, tgt_out: Ids) -> tuple[Tensor, Tensor, Tensor]:
    """A training batch checked by ``spec.validate.check_train_batch`` on host copies, then as int64 tensors on
    the model's device: src (B, S), tgt_in (B, T), tgt_out (B, T)."""
    validate.check_train_batch(host_ids(src), host_ids(tgt_in, "tgt_in"), host_ids(tgt_out, "tgt_out"),
                               model.config)
    dev = model.embedding.device
    return device_ids(src, dev), device_ids(tgt_in, dev), device_ids(tgt_out, dev)


def _lm_batch(model: LanguageModel, tokens: Ids) -> Tensor:
    """A next-token batch checked by ``spec.validate.check_lm_batch`` on a host copy, then as an int64 tensor
    (B, T) on the model's device."""
    validate.check_lm_batch(host_ids(tokens, "tokens"), model.config)
    return device_ids(tokens, model.embedding.device)


def _loss_and_gradients(model: TransformerBase, inputs: tuple[Tensor, ...], tgt_out: Tensor,
                        label_smoothing: float, rng: torch.Generator | None) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss of ``model(*inputs)`` against ``tgt_out`` and its gradients with respect to fp32 leaves standing in
    for the parameters (``loss_and_gradients`` says why), in ``spec.schema`` order."""
    leaves = {name: p.detach().float().requires_grad_() for name, p in model.named_parameters()}
    with torch.enable_grad():
        logits = torch.func.functional_call(model, leaves, inputs, {"rng": rng})  # (B, T, V) float32
        loss = smoothed_loss(logits, tgt_out, label_smoothing, model.config.pad_id)  # () float32
        grads = torch.autograd.grad(loss, list(leaves.values()))
    return loss.detach(), dict(zip(leaves, grads, strict=True))
