"""Greedy and beam search with the KV cache (section 6.1), step for step the algorithms of ``spec.search``.

Both start from ``bos_id``, generate at most ``limit_b`` tokens for sequence b (default: its non-pad source
length + 50, ``spec.validate.generation_limits``) and stop a sequence at ``eos_id``. Output: (B, L) int64 tokens
that exclude BOS and include EOS, right-padded with ``pad_id`` to the longest row. Exact ties break toward the
lower token id (in beam search, the lower flat index ``beam * V + token``). Pad and BOS are never generated
(``spec.search.forbid_special``). Cross-attention keys/values are computed once per source; each step feeds one
token per sequence through the cache. Inputs are validated once, up front; the steps then call the unchecked
computations of ``impl_torch.stacks`` (``encoder_memory``, ``source_cache``, ``decoder_logits``). Both compute
without dropout (no ``rng``) under ``torch.inference_mode``, whatever mode the model is in.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from impl_torch.inputs import Ids, device_ids, host_ids
from impl_torch.model import Transformer
from impl_torch.stacks import decoder_logits, encoder_memory, source_cache
from spec import validate
from spec.annotations import Int
from spec.search import length_penalty


@torch.inference_mode()
def greedy_search(model: Transformer, src: Ids, max_new_tokens: int | None = None) -> Int[Tensor, "B L"]:
    """Greedy decoding (section 6.1, ``spec.search.greedy_search``): src (B, S) int ids -> tokens (B, L) int64
    on the model's device.

    Raises:
        ValueError: from ``spec.validate.check_source`` and ``spec.validate.generation_limits``.
    """
    host = host_ids(src)
    validate.check_source(host, model.config)
    limits = validate.generation_limits(host, model.config, max_new_tokens)
    dev = model.embedding.device
    out = torch.full((len(limits), int(limits.max())), model.config.pad_id, dtype=torch.long, device=dev)
    return _greedy(model, device_ids(src, dev), limits, out)


def _greedy(model: Transformer, src: Tensor, limits: np.ndarray, out: Tensor) -> Tensor:
    """The loop of ``greedy_search``: validated src (B, S) int64, limits (B,), out (B, L) int64 ``pad_id``-filled,
    whose L (the longest limit) fixes the cache capacity -> tokens (B, <= L) int64, written into ``out``."""
    c, dev, L = model.config, model.embedding.device, out.shape[1]
    cache = source_cache(model, encoder_memory(model, src), src, L)
    special = torch.tensor([c.pad_id, c.bos_id], device=dev)                   # never generated
    limit = torch.as_tensor(limits, device=dev)                                # (B,)
    done = torch.zeros(len(limits), dtype=torch.bool, device=dev)
    tokens = torch.full((len(limits),), c.bos_id, dtype=torch.long, device=dev)
    for t in range(L):
        logits = decoder_logits(model, tokens[:, None], cache)[:, 0].index_fill_(-1, special, -torch.inf)
        tokens = logits.argmax(dim=-1).masked_fill(done, c.pad_id)              # argmax: first of equal maxima
        out[:, t] = tokens
        done |= (tokens == c.eos_id) | (t + 1 >= limit)
        if bool(done.all()):
            return out[:, :t + 1]
    return out


class BeamState(NamedTuple):
    """The live state of a batched beam search over B sources, k beams each (the fields named as Flax's
    ``decode.py`` names them): live_seqs (B, k, t) int64, the live hypotheses; live_logprobs (B, k) fp32, their
    log-probabilities; finished_seqs (B, k, L) int64, the finished ones padded to L; finished_scores (B, k) fp32,
    their length-penalised scores (-inf: an empty slot)."""

    live_seqs: Tensor
    live_logprobs: Tensor
    finished_seqs: Tensor
    finished_scores: Tensor


@torch.inference_mode()
def beam_search(model: Transformer, src: Ids, beam_size: int = 4, alpha: float = 0.6,
                max_new_tokens: int | None = None) -> Int[Tensor, "B L"]:
    """Beam search (section 6.1, ``spec.search.beam_search``) with the length penalty ((5 + |Y|) / 6)^alpha
    (Wu et al., 2016; the paper: beam 4, alpha 0.6), batched over sources: src (B, S) int ids -> tokens (B, L)
    int64 on the model's device.

    Per source, as ``spec.search``: k alive hypotheses and k finished slots; each step takes the top 2k of
    alive log-probability + log_softmax(logits) (ties to the lower flat index), keeps the first k non-EOS as
    alive and merges the EOS ones, scored cand / lp(t), into the finished (old before new on ties); a source stops
    at its limit or when its worst finished score >= best alive / lp(limit). Result: best finished, else best alive.

    Raises:
        ValueError: from ``spec.validate.check_source``, ``generation_limits`` and ``check_beam``.
    """
    host = host_ids(src)
    validate.check_source(host, model.config)
    limits = validate.generation_limits(host, model.config, max_new_tokens)
    validate.check_beam(beam_size, alpha, limits)
    penalties = torch.tensor([length_penalty(n, float(alpha)) for n in range(int(limits.max()) + 1)],
                             dtype=torch.float32, device=model.embedding.device)        # (L + 1,)
    return _beam(model, device_ids(src, model.embedding.device), limits, penalties, int(beam_size))


def _beam(model: Transformer, src: Tensor, limits: np.ndarray, penalties: Tensor, k: int) -> Tensor:
    """The loop of ``beam_search``: validated src (B, S) int64, limits (B,), penalties (L + 1,) float32 the length
    penalties of lengths 0..L, whose L (the longest limit) fixes the cache capacity, k beams -> tokens (B, <= L)
    int64."""
    c, V, dev = model.config, model.config.vocab_size, model.embedding.device
    B, L = len(limits), penalties.shape[0] - 1
    memory = encoder_memory(model, src).repeat_interleave(k, dim=0)                 # (B*k, S, D): encoded once
    cache = source_cache(model, memory, src.repeat_interleave(k, dim=0), L)
    f32 = {"dtype": torch.float32, "device": dev}
    special = torch.tensor([c.pad_id, c.bos_id], device=dev)                       # never generated
    limit_penalty = penalties[torch.as_tensor(limits, device=dev)]                 # (B,) of each source's limit
    live_logprobs = torch.full((B, k), -torch.inf, **f32)                               # (B, k): only beam 0 alive
    live_logprobs[:, 0] = 0.0
    s = BeamState(live_seqs=torch.zeros(B, k, 0, dtype=torch.long, device=dev), live_logprobs=live_logprobs,
                  finished_seqs=torch.full((B, k, L), c.pad_id, dtype=torch.long, device=dev),
                  finished_scores=torch.full((B, k), -torch.inf, **f32))
    tokens = torch.full((B * k,), c.bos_id, dtype=torch.long, device=dev)
    rows = torch.arange(B, device=dev)[:, None] * k                                 # (B, 1) first row of each source
    results: list[Tensor | None] = [None] * B
    for t in range(1, L + 1):
        logits = decoder_logits(model, tokens[:, None], cache)[:, 0]   # (B*k, V) fp32
        logp = torch.log_softmax(logits, dim=-1).index_fill_(-1, special, -torch.inf)  # over all of V, then -inf
        cand = (s.live_logprobs[..., None] + logp.view(B, k, V)).view(B, k * V)
        top = stable_topk(cand, 2 * k)                                                     # (B, 2k) flat indices
        beam, tok, score = top // V, top % V, cand.gather(1, top)
        seq = torch.cat([s.live_seqs.take_along_dim(beam[..., None], 1), tok[..., None]], dim=-1)  # (B, 2k, t)
        is_eos = tok == c.eos_id

        alive_score = score.masked_fill(is_eos, -torch.inf)
        alive = alive_score.sort(dim=-1, descending=True, stable=True).indices[:, :k]  # (B, k)
        tokens = tok.gather(1, alive).flatten()
        # The cache's self-attention state to the surviving beams' rows, the written prefix only (cross-attention
        # state is per source, the same for every beam of it).
        picked, n = (rows + beam.gather(1, alive)).flatten(), cache.length
        for ck, cv in cache.self_kv:
            ck[:, :, :n], cv[:, :, :n] = ck[picked, :, :n], cv[picked, :, :n]
        cache.key_mask[:, :n] = cache.key_mask[picked, :n]

        new_score = torch.where(is_eos, score / penalties[t], -torch.inf)
        merged = torch.cat([s.finished_scores, new_score], dim=1)                         # (B, 3k): old before new
        keep = merged.sort(dim=-1, descending=True, stable=True).indices[:, :k]
        padded = torch.cat([s.finished_seqs, torch.nn.functional.pad(seq, (0, L - t), value=c.pad_id)], dim=1)
        s = BeamState(seq.take_along_dim(alive[..., None], 1), alive_score.gather(1, alive),
                      padded.take_along_dim(keep[..., None], 1), merged.gather(1, keep))

        best_reachable = s.live_logprobs.max(dim=1).values / limit_penalty                # (B,)
        stop = (s.finished_scores.min(dim=1).values >= best_reachable).cpu().numpy() | (t == limits)
        for b in stop.nonzero()[0]:
            if results[b] is None:  # the best finished up to its EOS, else (none finished) the best alive
                fin = s.finished_seqs[b, 0]
                results[b] = fin[:int((fin == c.eos_id).nonzero()[0]) + 1] if torch.isfinite(s.finished_scores[b, 0]) \
                    else s.live_seqs[b, 0]
        if all(r is not None for r in results):
            break
    out = torch.full((B, max(len(r) for r in results)), c.pad_id, dtype=torch.long, device=dev)
    for b, r in enumerate(results):
        out[b, :len(r)] = r
    return out


def stable_topk(cand: Tensor, n: int) -> Tensor:
    """Flat indices (B, n) of each row's n largest entries of cand (B, N), in descending order, equal values in
    index order: the first n of a stable descending sort, without sorting all N (``torch.topk`` leaves the order
    of equal values open). One ``topk`` of n + 1 settles a row whose n-th and (n+1)-th values differ, the n largest
    then being one set; a tie across that cut takes every entry above the n-th value and the first ties at it."""
    vals, idx = cand.topk(min(n + 1, cand.shape[-1]), dim=-1)                   # (B, n + 1)
    if vals.shape[-1] > n and bool((vals[:, n - 1] == vals[:, n]).any()):
        thr = vals[:, n - 1:n]                                                  # (B, 1)
        above, tie = cand > thr, cand == thr
        take = above | (tie & (tie.cumsum(-1) <= n - above.sum(-1, keepdim=True)))  # (B, N): n per row
        idx = take.nonzero()[:, 1].view(-1, n)                                  # (B, n) in index order
    else:
        idx = idx[:, :n].sort(dim=-1).values                                    # (B, n) in index order
    return idx.gather(1, cand.gather(1, idx).sort(dim=-1, descending=True, stable=True).indices)
