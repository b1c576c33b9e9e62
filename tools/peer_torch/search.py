"""The peer's greedy and beam search (``spec.search``'s algorithms) without a KV cache. See ``tools.peer_torch``."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from spec import validate
from spec.config import Config
from spec.search import length_penalty
from tools.peer_torch.model import Transformer, host_ids, in_mode, to_tensor


def _special_mask(c: Config) -> Tensor:
    """(V,) bool, True at pad and BOS: never generated."""
    mask = torch.zeros(c.vocab_size, dtype=torch.bool)
    mask[[c.pad_id, c.bos_id]] = True
    return mask


def next_logits(model: Transformer, prefix: Tensor, memory: Tensor, src_pad: Tensor) -> Tensor:
    """prefix (N, t) ids from BOS, memory (N, S, D), src_pad (N, S) -> the last position's logits (N, V) fp32."""
    h = model._decode(prefix, memory, src_pad)                                            # (N, t, D)
    return model._project(h[:, -1])                                                       # (N, V)


def greedy_search(model: Transformer, src: Any, max_new_tokens: int | None = None) -> np.ndarray:
    """Greedy decoding (``spec.search.greedy_search``): src (B, S) ids -> tokens (B, L) int64 NumPy, EOS
    included, right-padded with pad; evaluation mode and ``inference_mode`` whatever the model's mode.

    Raises:
        ValueError: from ``spec.validate.check_source`` and ``generation_limits``.
    """
    c = model.config
    host = host_ids(src)
    validate.check_source(host, c)
    limits = validate.generation_limits(host, c, max_new_tokens)
    B, L = len(limits), int(limits.max())
    with in_mode(model, False), torch.inference_mode(), model._autocast():
        src_t = to_tensor(host)
        src_pad = src_t == c.pad_id                                                       # (B, S)
        memory = model._encode(src_t)                                                     # (B, S, D)
        special = _special_mask(c)
        limit = torch.as_tensor(limits)
        out = torch.full((B, L), c.pad_id, dtype=torch.long)
        prefix = torch.full((B, 1), c.bos_id, dtype=torch.long)                           # (B, t)
        live = torch.arange(B)                                                            # rows still decoding
        for t in range(L):
            logits = next_logits(model, prefix, memory, src_pad).masked_fill(special, -torch.inf)    # (n, V)
            tokens = logits.argmax(dim=-1)                                                # first of equal maxima
            out[live, t] = tokens
            going = (tokens != c.eos_id) & (t + 1 < limit[live])                          # (n,)
            if not going.any():
                out = out[:, :t + 1]
                break
            prefix = torch.cat([prefix, tokens[:, None]], dim=1)[going]
            memory, src_pad, live = memory[going], src_pad[going], live[going]
    return out.numpy()


def _stable_desc(x: Tensor) -> Tensor:
    """Indices sorting ``x`` (N, M) descending along the last axis; equal values keep index order."""
    return torch.sort(x, dim=-1, descending=True, stable=True).indices


def stable_top(x: Tensor, n: int) -> Tensor:
    """``_stable_desc(x)[:, :n]`` without sorting all of x (N, M): ``topk``, then its n indices in the stable order;
    rows with a tie across the n-th value (-inf ones included) take the full stable sort."""
    values, idx = torch.topk(x, n, dim=-1)                                                # (N, n)
    idx = idx.sort(dim=-1).values
    idx = idx.gather(-1, _stable_desc(x.gather(-1, idx)))
    tied = (x >= values[:, -1:]).sum(dim=-1) != n                                        # (N,)
    if tied.any():
        idx[tied] = _stable_desc(x[tied])[:, :n]
    return idx


def beam_search(model: Transformer, src: Any, beam_size: int = 4, alpha: float = 0.6,
                max_new_tokens: int | None = None) -> np.ndarray:
    """Beam search (``spec.search``'s module docstring), batched over rows: src (B, S) -> tokens (B, L) int64
    NumPy, EOS included, right-padded with pad; evaluation mode and ``inference_mode`` whatever the model's mode.

    Raises:
        ValueError: from ``spec.validate.check_source``, ``generation_limits`` and ``check_beam``.
    """
    c = model.config
    host = host_ids(src)
    validate.check_source(host, c)
    limits = validate.generation_limits(host, c, max_new_tokens)
    validate.check_beam(beam_size, alpha, limits)
    k, alpha, V = int(beam_size), float(alpha), c.vocab_size
    B, L = len(limits), int(limits.max())
    results: list[np.ndarray | None] = [None] * B
    neg_inf = torch.tensor(-torch.inf)
    with in_mode(model, False), torch.inference_mode(), model._autocast():
        src_t = to_tensor(host)
        src_pad = (src_t == c.pad_id).repeat_interleave(k, dim=0)                        # (B k, S)
        memory = model._encode(src_t).repeat_interleave(k, dim=0)                         # (B k, S, D)
        special = _special_mask(c)
        live = torch.arange(B)                                                            # rows still searching
        limit = torch.as_tensor(limits)                                                   # (B,)
        max_lp = torch.tensor([length_penalty(int(n), alpha) for n in limits], dtype=torch.float32)   # (B,)
        alive_seq = torch.zeros((B, k, 0), dtype=torch.long)                              # (n, k, t)
        alive_lp = torch.full((B, k), -torch.inf).index_fill(1, torch.tensor([0]), 0.0)  # (n, k) fp32
        fin_seq = torch.full((B, k, L), c.pad_id, dtype=torch.long)                       # (n, k, L)
        fin_score = torch.full((B, k), -torch.inf)                                        # (n, k)
        for t in range(1, L + 1):
            n = len(live)
            prefix = torch.cat([torch.full((n * k, 1), c.bos_id, dtype=torch.long),
                                alive_seq.flatten(0, 1)], dim=1)                          # (n k, t)
            logits = next_logits(model, prefix, memory, src_pad)                          # (n k, V) fp32
            logp = torch.log_softmax(logits, dim=-1).masked_fill(special, -torch.inf)
            cand = (alive_lp[:, :, None] + logp.view(n, k, V)).flatten(1)                 # (n, k V)
            top = stable_top(cand, 2 * k)                                                 # (n, 2k)
            top_score = cand.gather(1, top)
            beam, tok = top // V, top % V
            seq = torch.cat([alive_seq.gather(1, beam[:, :, None].expand(-1, -1, t - 1)), tok[:, :, None]],
                            dim=2)                                                        # (n, 2k, t)
            is_eos = tok == c.eos_id
            lp_t = torch.tensor(length_penalty(t, alpha), dtype=torch.float32)

            alive_score = torch.where(is_eos, neg_inf, top_score)
            alive = _stable_desc(alive_score)[:, :k]                                      # (n, k)
            alive_seq = seq.gather(1, alive[:, :, None].expand(-1, -1, t))
            alive_lp = alive_score.gather(1, alive)

            new_score = torch.where(is_eos, top_score / lp_t, neg_inf)
            merged = torch.cat([fin_score, new_score], dim=1)                             # (n, 3k)
            keep = _stable_desc(merged)[:, :k]
            new_seq = F.pad(seq, (0, L - t), value=c.pad_id)                              # (n, 2k, L)
            fin_seq = torch.cat([fin_seq, new_seq], dim=1).gather(1, keep[:, :, None].expand(-1, -1, L))
            fin_score = merged.gather(1, keep)

            bound = alive_lp.max(dim=1).values / max_lp[live]                            # (n,) fp32
            stop = (t == limit[live]) | (fin_score.min(dim=1).values >= bound)
            for i in torch.nonzero(stop).flatten().tolist():
                b = int(live[i])
                if torch.isfinite(fin_score[i, 0]):
                    row = fin_seq[i, 0]
                    results[b] = row[:int(torch.nonzero(row == c.eos_id)[0, 0]) + 1].numpy()
                else:
                    results[b] = alive_seq[i, 0].numpy()
            going = ~stop
            if not going.any():
                break
            live, alive_seq, alive_lp, fin_seq, fin_score = (
                live[going], alive_seq[going], alive_lp[going], fin_seq[going], fin_score[going])
            beams = going.repeat_interleave(k)
            memory, src_pad = memory[beams], src_pad[beams]
    out = np.full((B, max(len(r) for r in results)), c.pad_id, np.int64)
    for b, r in enumerate(results):
        out[b, :len(r)] = r
    return out
