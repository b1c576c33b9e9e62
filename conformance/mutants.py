"""Mutation test: proof that the conformance suite can fail.

Each mutant replaces a function or method of ``spec.reference`` (its ``layers``
and ``model``), ``spec.search`` or ``spec.training`` with a plausible bug:
eleven break the paper's mathematics,
two only the numerics contract (they prove the tolerance policy is tight enough
to see a backend that rounds where the contract says not to), five break
decoding (the search, the length penalty, the KV cache's positions, the special
tokens), and five break training (label smoothing off, padding counted in the
loss, Adam's beta2 0.999, no warmup, dropout left on in evaluation).
The suite runs against the mutated reference backend (``--mutant NAME``), in a
subprocess per mutant, and must fail; the table names the checks that caught it.

    python -m conformance.mutants [--only NAME ...] [--report-dir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from spec import search, training
from spec.numerics import MASKED_SCORE
from spec.reference import layers, model
from spec.reference.numerics import linear

_ROOTS = {"layers": layers, "model": model, "search": search, "training": training}


def _resolve(path: str):
    """The object at a dotted ``path`` under ``_ROOTS``: a module, a class, a function or a method."""
    root, *attrs = path.split(".")
    obj = _ROOTS[root]
    for attr in attrs:
        obj = getattr(obj, attr)
    return obj


_original = {target: _resolve(target) for target in (
    "layers.positional_encoding", "layers.Embedder.encode", "layers.Embedder.decode",
    "layers.scaled_dot_product_attention", "layers.LayerNorm.__init__", "layers.EncoderLayer.__init__",
    "layers.DecoderLayer.__init__", "search.length_penalty", "training.label_smoothed_cross_entropy",
    "training.loss_gradient", "training.adam_update")}


def _pe_sin_cos_swapped(length, d_model):
    pe = _original["layers.positional_encoding"](length, d_model)
    return pe[:, [i ^ 1 for i in range(d_model)]]  # even columns get cos, odd get sin


def _pe_positions_from_one(length, d_model):
    return _original["layers.positional_encoding"](length + 1, d_model)[1:]


def _embed_unscaled(self, ids, start=0):
    pe = self.nx.acc(layers.positional_encoding(start + ids.shape[1], self.c.d_model)[start:])
    return self.nx.act(self.table[ids] + pe)


def _attention(q, k, v, mask, nx, scale, round_scores):
    # layers.scaled_dot_product_attention with the mutants' two knobs
    k, v = (np.ascontiguousarray(a.transpose(0, 2, 1, 3)) for a in (k, v))
    scores = np.einsum("bthk,bshk->bhts", q, k)
    scores = nx.acc((nx.act(scores) if round_scores else nx.acc(scores)) * nx.acc(scale))
    scores = np.where(mask[:, None], scores, MASKED_SCORE)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = nx.act(nx.acc(e / e.sum(axis=-1, keepdims=True)))
    return nx.act(np.einsum("bhts,bshc->bthc", probs, v))


def _scale_by_d_k(q, k, v, mask, nx):
    return _attention(q, k, v, mask, nx, 1.0 / q.shape[-1], round_scores=False)


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
    _original["layers.DecoderLayer.__init__"](self, params, prefix, c, nx)
    self.cross_attn = _AttendsToDecoder(self.cross_attn)


def _pre_ln_encoder_layer(self, params, prefix, c, nx):
    _original["layers.EncoderLayer.__init__"](self, params, prefix, c.replace(norm_first=True), nx)


def _pre_ln_decoder_layer(self, params, prefix, c, nx):
    _original["layers.DecoderLayer.__init__"](self, params, prefix, c.replace(norm_first=True), nx)


def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def _ffn_gelu(self, x):
    return linear(_gelu(linear(x, self.w_1, self.b_1, nx=self.nx)), self.w_2, self.b_2, nx=self.nx)


def _ffn_without_b1(self, x):
    return linear(np.maximum(linear(x, self.w_1, nx=self.nx), 0.0), self.w_2, self.b_2, nx=self.nx)


def _layer_norm_eps_1e5(self, params, prefix, eps, nx):
    _original["layers.LayerNorm.__init__"](self, params, prefix, 1e-5, nx)


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


def _may_emit_special(scores, c):
    return scores


def _dropout_in_evaluation(self, ids, start=0):
    x, rate = _original["layers.Embedder.encode"](self, ids, start), self.c.dropout
    keep = np.random.default_rng(0).random(x.shape) >= rate  # dropout belongs to training only
    return self.nx.act(x * keep / (1.0 - rate))


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


# name -> (target, replacement), or a tuple of them for a mutant that replaces several; a target is a dotted
# path under _ROOTS, a module function or a class method, which the reference looks up at call time
MUTANTS: dict[str, tuple] = {
    "pe_sin_cos_swapped": ("layers.positional_encoding", _pe_sin_cos_swapped),
    "pe_positions_from_1": ("layers.positional_encoding", _pe_positions_from_one),
    "embedding_not_scaled_by_sqrt_d_model": ("layers.Embedder.encode", _embed_unscaled),
    "scores_divided_by_d_k": ("layers.scaled_dot_product_attention", _scale_by_d_k),
    "causal_mask_hides_diagonal": ("model.causal_mask", _causal_hides_diagonal),
    "cross_attention_kv_from_decoder": ("layers.DecoderLayer.__init__", _cross_attention_from_decoder),
    "pre_ln_instead_of_post_ln": (("layers.EncoderLayer.__init__", _pre_ln_encoder_layer),
                                  ("layers.DecoderLayer.__init__", _pre_ln_decoder_layer)),
    "relu_replaced_by_gelu": ("layers.FeedForward.forward", _ffn_gelu),
    "ffn_bias_b1_dropped": ("layers.FeedForward.forward", _ffn_without_b1),
    "layer_norm_eps_1e-5": ("layers.LayerNorm.__init__", _layer_norm_eps_1e5),
    "output_projection_not_shared_embedding": ("layers.Embedder.decode", _untied_output),
    "attention_scores_rounded_to_bf16": ("layers.scaled_dot_product_attention", _scores_rounded_to_bf16),
    "logits_rounded_to_bf16": ("layers.Embedder.decode", _logits_rounded_to_bf16),
    "beam_alpha_forced_to_0": ("search.length_penalty", _alpha_forced_to_0),
    "beam_length_penalty_without_eos": ("search.length_penalty", _length_penalty_without_eos),
    "beam_top_k_not_2k_candidates": ("search.candidate_count", _top_k_candidates),
    "incremental_decoding_positions_plus_1": ("layers.Embedder.encode", _incremental_positions_plus_1),
    "search_may_emit_pad_or_bos": ("search.forbid_special", _may_emit_special),
    "dropout_left_on_in_evaluation": ("layers.Embedder.encode", _dropout_in_evaluation),
    "label_smoothing_off": (("training.label_smoothed_cross_entropy", _loss_without_label_smoothing),
                            ("training.loss_gradient", _loss_gradient_without_label_smoothing)),
    "padding_counted_in_loss": (("training.label_smoothed_cross_entropy", _loss_counting_padding),
                                ("training.loss_gradient", _loss_gradient_counting_padding)),
    "adam_beta2_0.999": ("training.adam_update", _adam_beta2_0999),
    "schedule_without_warmup": ("training.learning_rate", _schedule_without_warmup),
}


def apply(name: str) -> None:
    """Replace the function or method that mutant ``name`` targets, for this process."""
    if name not in MUTANTS:
        raise ValueError(f"unknown mutant {name!r}; choose from {sorted(MUTANTS)}")
    patches = MUTANTS[name] if isinstance(MUTANTS[name][0], tuple) else (MUTANTS[name],)
    for target, fn in patches:
        owner, _, attr = target.rpartition(".")
        _check_signature(name, _resolve(target), fn)
        setattr(_resolve(owner), attr, fn)


def _check_signature(name, original, mutant) -> None:
    # A mutant that cannot be called as the original is "caught" by a TypeError, not by the suite.
    params = inspect.signature(original).parameters.values()
    positional = [None] * sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    keywords = {p.name: None for p in params if p.kind is p.KEYWORD_ONLY}
    try:
        inspect.signature(mutant).bind(*positional, **keywords)
    except TypeError as e:
        raise ValueError(f"mutant {name!r} does not take the arguments of {original.__qualname__}: {e}") from None


def run(name: str, report_dir: Path) -> list[str]:
    """Run the suite against mutant ``name``; the names of the checks that failed."""
    subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "conformance", "--backend", "reference",
                    "--mutant", name, "--report-dir", str(report_dir), "-q", "-p", "no:cacheprovider"],
                   capture_output=True, text=True, check=False)
    report = report_dir / f"conformance-reference+{name}.json"
    if not report.exists():
        raise RuntimeError(f"mutant {name}: the suite wrote no report")
    checks = json.loads(report.read_text())["checks"]
    return sorted(c for c, e in checks.items() if e["outcome"] == "failed")


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=sorted(MUTANTS))
    parser.add_argument("--report-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    report_dir = args.report_dir or Path(tempfile.mkdtemp(prefix="mutants-"))
    table = Table(title="Mutants of the reference: the checks that caught each")
    table.add_column("mutant")
    table.add_column("caught")
    table.add_column("failed checks")
    survived = []
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # one suite process per mutant
        results = dict(zip(args.only, pool.map(lambda n: run(n, report_dir), args.only), strict=True))
    for name, failed in results.items():
        if not failed:
            survived.append(name)
        shown = ", ".join(failed[:6]) + (f", ... ({len(failed)} in all)" if len(failed) > 6 else "")
        table.add_row(name, "[green]yes[/]" if failed else "[bold red]NO[/]", escape(shown))
    Console(width=200).print(table)
    print(f"{len(args.only) - len(survived)} of {len(args.only)} mutants caught" +
          (f"; survived: {', '.join(survived)}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
