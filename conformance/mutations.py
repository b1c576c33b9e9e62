"""The mutants of the mutation test (``conformance.mutants``): plausible bugs of the paper's model and of decoding,
each a replacement for a function or method of ``spec.reference`` (its ``layers``, ``stacks`` and ``model``) or
``spec.search``, which the reference looks up at call time (training's: ``conformance.mutations_training``).
``resolve`` finds the target of any module's mutant.
"""

from __future__ import annotations

import numpy as np

from spec import backward, backward_layers, sampling, search, training
from spec.numerics import MASKED_SCORE
from spec.reference import layers, model, stacks
from spec.reference.numerics import linear

_ROOTS = {"layers": layers, "stacks": stacks, "model": model, "search": search, "training": training,
          "backward": backward, "backward_layers": backward_layers, "sampling": sampling}


def resolve(path: str):
    """The object at a dotted ``path`` under ``_ROOTS``: a module, a class, a function or a method."""
    root, *attrs = path.split(".")
    obj = _ROOTS[root]
    for attr in attrs:
        obj = getattr(obj, attr)
    return obj


_original = {target: resolve(target) for target in (
    "layers.positional_encoding", "layers.Embedder.encode", "layers.Embedder.decode",
    "layers.scaled_dot_product_attention", "layers.LayerNorm.__init__", "stacks.EncoderLayer.__init__",
    "stacks.DecoderLayer.__init__", "search.length_penalty", "search.greedy_search",
    "training.label_smoothed_cross_entropy", "training.loss_gradient", "training.adam_update",
    "backward_layers.accumulate")}


def _pe_sin_cos_swapped(length, d_model, halves=False):
    pe = _original["layers.positional_encoding"](length, d_model, halves)
    return pe[:, [i ^ 1 for i in range(d_model)]]  # even columns get cos, odd get sin


def _pe_positions_from_one(length, d_model, halves=False):
    return _original["layers.positional_encoding"](length + 1, d_model, halves)[1:]


def _embed_unscaled(self, ids, start=0):
    pe = self.nx.acc(layers.positional_encoding(start + ids.shape[1], self.c.d_model)[start:])
    return self.nx.act(self.table[ids] + pe)


def _attention(q, k, v, mask, nx, scale, round_scores, shift=True):
    # layers.scaled_dot_product_attention with the mutants' three knobs
    k, v = (np.ascontiguousarray(a.transpose(0, 2, 1, 3)) for a in (k, v))
    scores = np.einsum("bthk,bshk->bhts", q, k)
    scores = nx.acc((nx.act(scores) if round_scores else nx.acc(scores)) * nx.acc(scale))
    scores = np.where(mask[:, None], scores, MASKED_SCORE)
    if shift:
        e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    else:  # an fp32 exp of the raw scores: inf above 88.7, 0 at MASKED_SCORE
        with np.errstate(over="ignore"):
            e = nx.acc(np.exp(scores))
    with np.errstate(invalid="ignore"):
        probs = nx.act(nx.acc(e / e.sum(axis=-1, keepdims=True)))
    return nx.act(np.einsum("bhts,bshc->bthc", probs, v))


def _scale_by_d_k(q, k, v, mask, nx):
    return _attention(q, k, v, mask, nx, 1.0 / q.shape[-1], round_scores=False)


def _softmax_without_max_subtraction(q, k, v, mask, nx):
    return _attention(q, k, v, mask, nx, 1.0 / np.sqrt(q.shape[-1]), round_scores=False, shift=False)


def _scores_rounded_to_bf16(q, k, v, mask, nx):
    if nx.mode != "bfloat16":
        return _original["layers.scaled_dot_product_attention"](q, k, v, mask, nx)
    return _attention(q, k, v, mask, nx, 1.0 / np.sqrt(q.shape[-1]), round_scores=True)  # rule 4: stay fp32


def _causal_hides_diagonal(start, n, length):
    q_pos = np.arange(start, start + n)[:, None]
    return (np.arange(length)[None, :] < q_pos)[None]


class _AttendsToDecoder:
    """A cross-attention whose keys and values come from the decoder's own positions, not the encoder output."""

    def __init__(self, attn):
        self.attn = attn

    def project_kv(self, x):
        return self.attn.project_kv(x)

    def forward(self, x, kv, mask):
        return self.attn.forward(x, self.attn.project_kv(x), np.ones((1, 1, x.shape[1]), bool))


def _cross_attention_from_decoder(self, params, prefix, c, nx):
    _original["stacks.DecoderLayer.__init__"](self, params, prefix, c, nx)
    self.cross_attn = _AttendsToDecoder(self.cross_attn)


def _pre_ln_encoder_layer(self, params, prefix, c, nx):
    _original["stacks.EncoderLayer.__init__"](self, params, prefix, c.replace(norm_first=True), nx)


def _pre_ln_decoder_layer(self, params, prefix, c, nx):
    _original["stacks.DecoderLayer.__init__"](self, params, prefix, c.replace(norm_first=True), nx)


def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def _ffn_gelu(self, x):
    return linear(_gelu(linear(x, self.w_1, self.b_1, nx=self.nx)), self.w_2, self.b_2, nx=self.nx)


def _ffn_without_b1(self, x):
    return linear(np.maximum(linear(x, self.w_1, nx=self.nx), 0.0), self.w_2, self.b_2, nx=self.nx)


def _layer_norm_eps_1e5(self, params, prefix, eps, nx):
    _original["layers.LayerNorm.__init__"](self, params, prefix, 1e-5, nx)


class _ResidualInFp32:
    # A layer's Numerics whose ``act``, used by the layer only for its residual sums, keeps them in fp32 (rule 5
    # asks for the activation dtype): a backend whose compiler keeps excess precision computes this.
    def __init__(self, nx):
        self.nx = nx

    def act(self, x):
        return self.nx.acc(x)

    def acc(self, x):
        return self.nx.acc(x)


def _residual_in_fp32_encoder(self, params, prefix, c, nx):
    _original["stacks.EncoderLayer.__init__"](self, params, prefix, c, nx)
    self.nx = _ResidualInFp32(nx)


def _residual_in_fp32_decoder(self, params, prefix, c, nx):
    _original["stacks.DecoderLayer.__init__"](self, params, prefix, c, nx)
    self.nx = _ResidualInFp32(nx)


def _layer_norm_statistics_in_activation_dtype(self, x):
    nx = self.nx  # mean and variance rounded to the activation dtype, not fp32 or better (rule 6)
    mu = nx.act(x.mean(axis=-1, keepdims=True))
    var = nx.act(nx.act((x - mu) ** 2).mean(axis=-1, keepdims=True))
    return nx.act((x - mu) / np.sqrt(var + self.eps) * self.scale + self.bias)


def _untied_output(self, x):
    rng = np.random.default_rng(0)  # an output matrix of the right shape and scale that is not the embedding
    w = rng.uniform(-1, 1, self.table.shape) * np.sqrt(3.0 / self.table.shape[1])
    return self.nx.acc(np.einsum("bnd,vd->bnv", x, w))


def _logits_rounded_to_bf16(self, x):
    return self.nx.act(_original["layers.Embedder.decode"](self, x))  # rule 7 says: float32, never rounded


def _alpha_forced_to_0(length, alpha):
    return _original["search.length_penalty"](length, 0.0)


def _length_penalty_without_eos(length, alpha):
    return _original["search.length_penalty"](length - 1, alpha)  # |Y| must count EOS


def _top_k_candidates(beam_size):
    return beam_size  # k candidates: when one ends at EOS, fewer than k stay alive


def _incremental_positions_plus_1(self, ids, start=0):
    return _original["layers.Embedder.encode"](self, ids, start + 1 if start > 0 else start)


def _greedy_writes_after_eos(params, src, c, nx, max_new_tokens=None, trace=None):
    out = _original["search.greedy_search"](params, src, c, nx, max_new_tokens, trace)
    ended = np.cumsum(np.cumsum(out == c.eos_id, axis=1), axis=1) > 1  # after a row's first EOS
    return np.where(ended, c.eos_id, out)  # the row goes on writing (EOS) until the longest ends: no padding


def _may_emit_special(scores, c):
    return scores


# name -> (target, replacement), or a tuple of them for a mutant that replaces several; a target is a dotted
# path under _ROOTS, a module function or a class method, which the reference looks up at call time
MUTANTS: dict[str, tuple] = {
    "pe_sin_cos_swapped": ("layers.positional_encoding", _pe_sin_cos_swapped),
    "pe_positions_from_1": ("layers.positional_encoding", _pe_positions_from_one),
    "embedding_not_scaled_by_sqrt_d_model": ("layers.Embedder.encode", _embed_unscaled),
    "scores_divided_by_d_k": ("layers.scaled_dot_product_attention", _scale_by_d_k),
    "softmax_without_max_subtraction": ("layers.scaled_dot_product_attention", _softmax_without_max_subtraction),
    "causal_mask_hides_diagonal": ("stacks.causal_mask", _causal_hides_diagonal),
    "cross_attention_kv_from_decoder": ("stacks.DecoderLayer.__init__", _cross_attention_from_decoder),
    "pre_ln_instead_of_post_ln": (("stacks.EncoderLayer.__init__", _pre_ln_encoder_layer),
                                  ("stacks.DecoderLayer.__init__", _pre_ln_decoder_layer)),
    "relu_replaced_by_gelu": ("layers.FeedForward.forward", _ffn_gelu),
    "ffn_bias_b1_dropped": ("layers.FeedForward.forward", _ffn_without_b1),
    "layer_norm_eps_1e-5": ("layers.LayerNorm.__init__", _layer_norm_eps_1e5),
    "output_projection_not_shared_embedding": ("layers.Embedder.decode", _untied_output),
    "attention_scores_rounded_to_bf16": ("layers.scaled_dot_product_attention", _scores_rounded_to_bf16),
    "logits_rounded_to_bf16": ("layers.Embedder.decode", _logits_rounded_to_bf16),
    "residual_sum_in_fp32": (("stacks.EncoderLayer.__init__", _residual_in_fp32_encoder),
                             ("stacks.DecoderLayer.__init__", _residual_in_fp32_decoder)),
    "layer_norm_statistics_in_bf16": ("layers.LayerNorm.forward", _layer_norm_statistics_in_activation_dtype),
    "beam_alpha_forced_to_0": ("search.length_penalty", _alpha_forced_to_0),
    "beam_length_penalty_without_eos": ("search.length_penalty", _length_penalty_without_eos),
    "beam_top_k_not_2k_candidates": ("search.candidate_count", _top_k_candidates),
    "incremental_decoding_positions_plus_1": ("layers.Embedder.encode", _incremental_positions_plus_1),
    "search_may_emit_pad_or_bos": ("search.forbid_special", _may_emit_special),
    "greedy_writes_after_eos": ("search.greedy_search", _greedy_writes_after_eos),
}
