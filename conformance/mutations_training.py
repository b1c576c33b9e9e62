"""The training mutants (``conformance.mutants``), as ``conformance.mutations``': each replaces a function or method
of ``spec.reference``, ``spec.training`` or ``spec.backward_layers`` that the reference looks up at call time:
dropout where evaluation or section 5.4 does not put it, the loss, its gradient, Adam and the schedule.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from spec import backward_layers, training
from spec.reference import layers

_original = {"layers.Embedder.encode": layers.Embedder.encode,
             "training.label_smoothed_cross_entropy": training.label_smoothed_cross_entropy,
             "training.loss_gradient": training.loss_gradient, "training.adam_update": training.adam_update,
             "backward_layers.accumulate": backward_layers.accumulate}


def _weight_gradients_in_bf16(grads, name, contribution, nx):
    grads[name] = nx.act(grads[name] + nx.act(contribution))  # parameter gradients must be fp32 (spec.backward)


def _layer_norm_scale_gradient_in_bf16(grads, name, contribution, nx):
    # One vector's gradient rounded, every other fp32: a LayerNorm scale, present in every model's decoder.
    if name != "decoder.layers.0.ffn_norm.scale":
        return _original["backward_layers.accumulate"](grads, name, contribution, nx)
    return _weight_gradients_in_bf16(grads, name, contribution, nx)


def _dropout_in_evaluation(self, ids, start=0):
    x, rate = _original["layers.Embedder.encode"](self, ids, start), self.c.dropout
    keep = np.random.default_rng(0).random(x.shape) >= rate  # dropout belongs to training only
    return self.nx.act(x * keep / (1.0 - rate))


def _dropout_after_residual_sum(self, x, mask, rng=None):
    attn = lambda h: self.self_attn.forward(h, self.self_attn.project_kv(h), mask)  # noqa: E731
    for name, sublayer, norm in (("self_attn", attn, self.self_attn_norm), ("ffn", self.ffn.forward, self.ffn_norm)):
        h = sublayer(norm.forward(x) if self.norm_first else x)
        x = layers.dropout(self.nx.act(x + h), name, self.rate, rng, self.nx)  # section 5.4 drops h, before the sum
        layers.record(name, h)  # the site's value as evaluation records it: the mutant changes training only
        x = layers.record(f"{name}.residual", x if self.norm_first else norm.forward(x))
    return x


def _loss_without_label_smoothing(logits, tgt_out, c, label_smoothing):
    return _original["training.label_smoothed_cross_entropy"](logits, tgt_out, c, 0.0)


def _loss_gradient_without_label_smoothing(logits, tgt_out, c, label_smoothing):
    return _original["training.loss_gradient"](logits, tgt_out, c, 0.0)


def _loss_counting_padding(logits, tgt_out, c, label_smoothing):
    logp = training.log_softmax(np.asarray(logits, np.float64))                    # (B, T, V)
    nll = -np.take_along_axis(logp, np.asarray(tgt_out)[..., None], axis=-1)[..., 0]
    return float(((1.0 - label_smoothing) * nll - label_smoothing * logp.mean(axis=-1)).mean())  # pad included


def _loss_gradient_counting_padding(logits, tgt_out, c, label_smoothing):
    z = np.asarray(logits, np.float64)
    q = np.full(z.shape, label_smoothing / z.shape[-1])
    np.put_along_axis(q, np.asarray(tgt_out)[..., None], 1.0 - label_smoothing + label_smoothing / z.shape[-1], -1)
    return (np.exp(training.log_softmax(z)) - q) / (z.shape[0] * z.shape[1])


def _adam_beta2_0999(params, grads, state, d_model, tc, *args, **kwargs):
    return _original["training.adam_update"](params, grads, state, d_model, dataclasses.replace(tc, beta2=0.999),
                                             *args, **kwargs)


def _schedule_without_warmup(step, d_model, warmup_steps, scale=1.0):
    return scale * d_model ** -0.5 * step ** -0.5


# name -> (target, replacement), or a tuple of them, as in ``conformance.mutations.MUTANTS``
TRAINING_MUTANTS: dict[str, tuple] = {
    "dropout_after_residual_sum": ("stacks.EncoderLayer.forward", _dropout_after_residual_sum),
    "dropout_left_on_in_evaluation": ("layers.Embedder.encode", _dropout_in_evaluation),
    "label_smoothing_off": (("training.label_smoothed_cross_entropy", _loss_without_label_smoothing),
                            ("training.loss_gradient", _loss_gradient_without_label_smoothing)),
    "padding_counted_in_loss": (("training.label_smoothed_cross_entropy", _loss_counting_padding),
                                ("training.loss_gradient", _loss_gradient_counting_padding)),
    "weight_gradients_in_bf16": ("backward_layers.accumulate", _weight_gradients_in_bf16),
    "layer_norm_scale_gradient_in_bf16": ("backward_layers.accumulate", _layer_norm_scale_gradient_in_bf16),
    "adam_beta2_0.999": ("training.adam_update", _adam_beta2_0999),
    "schedule_without_warmup": ("training.learning_rate", _schedule_without_warmup),
}
