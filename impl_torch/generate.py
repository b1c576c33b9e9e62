"""Greedy and beam search with the KV cache (section 6.1), step for step the algorithms of ``spec.search``.

Both start from ``bos_id``, generate at most ``limit_b`` tokens for sequence b (default: its non-pad source
length + 50, ``spec.validate.generation_limits``) and stop a sequence at ``eos_id``. Output: (B, L) int64 tokens
that exclude BOS and include EOS, right-padded with ``pad_id`` to the longest row. Exact ties break toward the
lower token id (in beam search, the lower flat index ``beam * V + token``). Pad and BOS are never generated
(``forbid_special``). Cross-attention keys/values are computed once per source; each step feeds one token per
sequence through the cache. Inputs are validated once, up front; the steps then call the model's unchecked
internals (``_encode``, ``_init_cache``, ``_decode``).
Both compute in evaluation mode (no dropout) whatever mode the model is in, and leave its mode as it was.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

import torch
from torch import Tensor

from impl_torch.model import Ids, Transformer, device_ids, host_ids
from spec import validate
from spec.search import length_penalty

if TYPE_CHECKING:  # shape hints (jaxtyping), for readers and type checkers only
    from jaxtyping import Int

Search = TypeVar("Search", bound=Callable[..., Tensor])


@contextlib.contextmanager
def evaluating(model: Transformer) -> Iterator[None]:
    """``model`` in evaluation mode for the block, then every submodule back in the mode it had."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def _search(fn: Search) -> Search:
    """A search entry point: evaluation mode for its duration (``evaluating``), under ``torch.inference_mode``."""
    @functools.wraps(fn)
    def run(model: Transformer, *args, **kwargs) -> Tensor:
        with evaluating(model), torch.inference_mode():
            return fn(model, *args, **kwargs)
    return run  # type: ignore[return-value]


def forbid_special(scores: Tensor, pad_id: int, bos_id: int) -> Tensor:
    """scores (..., V) with ``pad_id`` and ``bos_id`` at -inf: never generated (``spec.search.forbid_special``)."""
    return scores.index_fill(-1, torch.tensor([pad_id, bos_id], device=scores.device), -torch.inf)


@_search
def greedy_search(model: Transformer, src: Ids, max_new_tokens: int | None = None) -> Int[Tensor, "B L"]:
    """Greedy decoding (section 6.1, ``spec.search.greedy_search``): src (B, S) int ids -> tokens (B, L) int64
    on the model's device, in evaluation mode whatever the model's mode.

    Raises:
        ValueError: from ``spec.validate.check_source`` and ``spec.validate.generation_limits``.
    """
    c = model.config
    host = host_ids(src)
    validate.check_source(host, c)
    limits = validate.generation_limits(host, c, max_new_tokens)
    src, L = device_ids(src, model.device), int(limits.max())
    cache = model._init_cache(model._encode(src), src, L)
    limit = torch.as_tensor(limits, device=model.device)                       # (B,)
    out = torch.full((len(limits), L), c.pad_id, dtype=torch.long, device=model.device)
    done = torch.zeros(len(limits), dtype=torch.bool, device=model.device)
    tokens = torch.full((len(limits),), c.bos_id, dtype=torch.long, device=model.device)
    for t in range(L):
        logits = forbid_special(model._decode(tokens[:, None], cache)[:, 0], c.pad_id, c.bos_id)  # (B, V) fp32
        tokens = logits.argmax(dim=-1).masked_fill(done, c.pad_id)              # argmax: first of equal maxima
        out[:, t] = tokens
        done |= (tokens == c.eos_id) | (t + 1 >= limit)
        if bool(done.all()):
            return out[:, :t + 1]
    return out


def _descending(x: Tensor) -> Tensor:
    """Indices sorting each row of ``x`` descending; equal values keep index order (``spec.search``)."""
    return torch.sort(x, dim=-1, descending=True, stable=True).indices


def _top(x: Tensor, n: int) -> Tensor:
    """``_descending(x)[:, :n]`` without sorting all of x: (B, N) -> (B, n) indices, equal values in index order.

    ``topk`` finds the n-th largest value; every entry at least that large (n of them, more on ties) is kept in
    index order and only those are sorted, stably. Rows with many ties at the threshold (-inf) sort everything.
    """
    keep = x >= x.topk(n, dim=-1).values[:, -1:]                           # (B, N): n or more per row
    counts = keep.sum(dim=-1)                                               # (B,)
    m = int(counts.max())
    if m > 4 * n:
        return _descending(x)[:, :n]
    rows, cols = keep.nonzero(as_tuple=True)                                # row-major: index order per row
    pos = torch.arange(len(cols), device=x.device) - (counts.cumsum(0) - counts)[rows]
    idx = torch.zeros(x.shape[0], m, dtype=torch.long, device=x.device)     # (B, m), padded after the kept
    vals = torch.full((x.shape[0], m), -torch.inf, dtype=x.dtype, device=x.device)
    idx[rows, pos], vals[rows, pos] = cols, x[rows, cols]
    return idx.gather(1, _descending(vals)[:, :n])                          # pads sort after every kept entry


def _take(x: Tensor, idx: Tensor) -> Tensor:
    """x (B, N, ...) rows idx (B, M) along axis 1 -> (B, M, ...)."""
    return x[torch.arange(x.shape[0], device=x.device)[:, None], idx]


@_search
def beam_search(model: Transformer, src: Ids, beam_size: int = 4, alpha: float = 0.6,
                max_new_tokens: int | None = None) -> Int[Tensor, "B L"]:
    """Beam search (section 6.1, ``spec.search.beam_search``) with the length penalty ((5 + |Y|) / 6)^alpha
    (Wu et al., 2016; the paper: beam 4, alpha 0.6), batched over sources: src (B, S) int ids -> tokens (B, L)
    int64 on the model's device, in evaluation mode whatever the model's mode.

    Per source, as ``spec.search``: k alive hypotheses and k finished slots; each step takes the top 2k of
    alive log-probability + log_softmax(logits) (ties to the lower flat index), keeps the first k non-EOS as
    alive and merges the EOS ones, scored cand / lp(t), into the finished (old before new on ties); a source stops
    at its limit or when its worst finished score >= best alive / lp(limit). Result: best finished, else best alive.

    Raises:
        ValueError: from ``spec.validate.check_source``, ``generation_limits`` and ``check_beam``.
    """
    c, V, dev = model.config, model.config.vocab_size, model.device
    host = host_ids(src)
    validate.check_source(host, c)
    limits = validate.generation_limits(host, c, max_new_tokens)
    validate.check_beam(beam_size, alpha, limits)
    k, alpha = int(beam_size), float(alpha)
    B, L = len(limits), int(limits.max())
    src = device_ids(src, dev)
    memory = model._encode(src).repeat_interleave(k, dim=0)                         # (B*k, S, D): encoded once
    cache = model._init_cache(memory, src.repeat_interleave(k, dim=0), L)
    f32 = {"dtype": torch.float32, "device": dev}
    max_lp = torch.tensor([length_penalty(int(n), alpha) for n in limits], **f32)  # (B,) lp(limit_b)
    alive_seq = torch.zeros(B, k, 0, dtype=torch.long, device=dev)                 # (B, k, t)
    alive_lp = torch.full((B, k), -torch.inf, **f32)                               # (B, k): only beam 0 alive
    alive_lp[:, 0] = 0.0
    fin_seq = torch.full((B, k, L), c.pad_id, dtype=torch.long, device=dev)        # (B, k, L)
    fin_score = torch.full((B, k), -torch.inf, **f32)
    tokens = torch.full((B * k,), c.bos_id, dtype=torch.long, device=dev)
    rows = torch.arange(B, device=dev)[:, None] * k                                 # (B, 1) first row of each source
    results: list[Tensor | None] = [None] * B
    for t in range(1, L + 1):
        logits = model._decode(tokens[:, None], cache)[:, 0]                         # (B*k, V) fp32
        logp = forbid_special(torch.log_softmax(logits, dim=-1), c.pad_id, c.bos_id)    # over all of V, then -inf
        cand = (alive_lp[..., None] + logp.view(B, k, V)).view(B, k * V)
        top = _top(cand, 2 * k)                                                     # (B, 2k)
        beam, tok, score = top // V, top % V, cand.gather(1, top)
        seq = torch.cat([_take(alive_seq, beam), tok[..., None]], dim=-1)            # (B, 2k, t)
        is_eos = tok == c.eos_id

        alive_score = score.masked_fill(is_eos, -torch.inf)
        alive = _descending(alive_score)[:, :k]                                      # (B, k)
        alive_seq, alive_lp, tokens = _take(seq, alive), alive_score.gather(1, alive), tok.gather(1, alive).flatten()
        cache.select((rows + beam.gather(1, alive)).flatten())

        new_score = torch.where(is_eos, score / torch.tensor(length_penalty(t, alpha), **f32), -torch.inf)
        merged = torch.cat([fin_score, new_score], dim=1)                           # (B, 3k): old before new
        keep = _descending(merged)[:, :k]
        fin_seq = _take(torch.cat([fin_seq, torch.nn.functional.pad(seq, (0, L - t), value=c.pad_id)], dim=1), keep)
        fin_score = merged.gather(1, keep)

        stop = (fin_score.min(dim=1).values >= alive_lp.max(dim=1).values / max_lp).cpu().numpy() | (t == limits)
        for b in stop.nonzero()[0]:
            if results[b] is None:
                results[b] = _result(fin_seq[b, 0], fin_score[b, 0], alive_seq[b, 0], c.eos_id)
        if all(r is not None for r in results):
            break
    out = torch.full((B, max(len(r) for r in results)), c.pad_id, dtype=torch.long, device=dev)
    for b, r in enumerate(results):
        out[b, :len(r)] = r
    return out


def _result(fin_seq: Tensor, fin_score: Tensor, alive_seq: Tensor, eos_id: int) -> Tensor:
    """The best finished hypothesis up to and including its EOS, or the best alive one if none finished."""
    if torch.isfinite(fin_score):
        return fin_seq[:int((fin_seq == eos_id).nonzero()[0]) + 1]
    return alive_seq
