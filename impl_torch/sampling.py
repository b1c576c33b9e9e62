"""Sampling from the decoder-only model with the KV cache, step for step the algorithm of ``spec.sampling``.

``sample`` computes one step's draw for every row at once in fp32 torch ops on the logits' device: temperature,
top-k, softmax, top-p and the inverse CDF over one stable descending sort per row; its two comparisons with the
caller's numbers (the cumulative probability against top_p and against u) are exact, in float64, as the
reference's. The uniforms are ``spec.sampling.uniforms``', drawn on the host with NumPy and moved to the device
once (float64), never torch's RNG. ``generate`` validates up front, then calls the unchecked computations of
``impl_torch.stacks`` (``empty_cache``, ``decoder_logits``) under ``torch.inference_mode``, without dropout,
whatever mode the model is in.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from impl_torch.inputs import Ids, device_ids, host_ids
from impl_torch.layers import DTYPES
from impl_torch.lm import LanguageModel
from impl_torch.stacks import decoder_logits, empty_cache
from spec import sampling, validate
from spec.annotations import Float, Int


def sample(logits: Float[Tensor, "B V"], u: Float[Tensor, " B"], temperature: float, top_k: int | None,
           top_p: float) -> Int[Tensor, " B"]:
    """One step's tokens (``spec.sampling.sample``): fp32 logits (B, V) with pad and BOS at -inf, uniforms u (B,)
    in [0, 1) -> tokens (B,) int64, on the logits' device. Arguments as validated by
    ``spec.sampling.check_sampling``.

    Temperature 0 is the argmax (the first of equal maxima: the lower id). Otherwise, in fp32: the logits divided
    by the temperature rounded to fp32; one stable descending sort (ties to the lower id, the -inf of pad and BOS
    last, never kept); the first ``top_k``; their max-subtracted softmax; the shortest prefix whose cumulative
    probability reaches ``top_p`` (a position is kept iff the sum before it is < ``top_p``); renormalised; the
    first kept token whose cumulative probability exceeds u, the last kept one if none does.
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    z = logits.float() / torch.tensor(float(temperature), dtype=torch.float32, device=logits.device)
    z, order = z.sort(dim=-1, descending=True, stable=True)                                 # (B, V)
    rank = torch.arange(z.shape[-1], device=z.device)
    kept = torch.isfinite(z) & (rank < (z.shape[-1] if top_k is None else top_k))           # top-k: a prefix
    e = torch.where(kept, torch.exp(z - z[:, :1]), 0.0)                                     # max-subtracted
    p = e / e.sum(dim=-1, keepdim=True)                                                     # softmax over the kept
    if top_p < 1.0:
        before = torch.cat([torch.zeros_like(p[:, :1]), p.cumsum(dim=-1)[:, :-1]], dim=-1)  # the sum before each
        kept &= before.double() < top_p                                                     # position 0 always kept
        p = torch.where(kept, p, 0.0)
    cdf = p.cumsum(dim=-1) / p.sum(dim=-1, keepdim=True)                                    # renormalised
    j = ((cdf.double() <= u.double()[:, None]) & kept).sum(dim=-1, keepdim=True)            # the first cdf > u
    j = torch.minimum(j, kept.sum(dim=-1, keepdim=True) - 1)                                # else the last kept
    return order.gather(1, j)[:, 0]


@torch.inference_mode()
def generate(model: LanguageModel, prompt: Ids, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, top_p: float = 1.0, seed: int = 0) -> Int[Tensor, "B N"]:
    """A continuation of each prompt (``spec.sampling.generate``): prompt (B, L) int ids, right-padded -> new
    tokens (B, N) int64 on the model's device.

    One prefill call over the positions every row's prompt covers, then one position per call: a row still inside
    its prompt is fed its next prompt token, a finished row ``pad_id``, the others their new token; row b's t-th
    new token is drawn with ``u[b, t]`` of ``spec.sampling.uniforms(seed, B, max_new_tokens)``. Stops when every
    row has ended (EOS or ``max_new_tokens``).

    Raises:
        ValueError: from ``spec.validate.check_prompt`` and ``spec.sampling.check_sampling``, before anything is
            computed; from ``spec.validate.check_model_kind`` for an encoder-decoder model.
    """
    c = model.config
    host = host_ids(prompt, "prompt")
    lengths = validate.check_prompt(host, c, max_new_tokens)
    sampling.check_sampling(temperature, top_k, top_p, seed)
    validate.check_model_kind(c, decoder_only=True)
    dev = model.embedding.device
    u = torch.as_tensor(sampling.uniforms(seed, len(lengths), int(max_new_tokens)), dtype=torch.float64, device=dev)
    return _generate(model, device_ids(host, dev), lengths, u, int(max_new_tokens), temperature, top_k, top_p)


def _generate(model: LanguageModel, prompt: Tensor, lengths: np.ndarray, u: Tensor, max_new: int,
              temperature: float, top_k: int | None, top_p: float) -> Tensor:
    """The loop of ``generate`` on validated input: prompt (B, L) int64 and its lengths (B,), uniforms u (B, N)
    of the N = ``max_new`` new tokens -> new tokens (B, <= N)."""
    c, dev, B, N = model.config, prompt.device, prompt.shape[0], max_new
    first, last = int(lengths.min()), int(lengths.max())
    special = torch.tensor([c.pad_id, c.bos_id], device=dev)                             # never generated
    length, rows = torch.as_tensor(lengths, device=dev), torch.arange(B, device=dev)
    out = torch.full((B, N), c.pad_id, dtype=torch.long, device=dev)
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    cache = empty_cache(model, B, last + N, DTYPES[c.dtype], dev)
    logits = decoder_logits(model, prompt[:, :first], cache, at=first - 1)               # prefill
    for pos in range(first, last + N):
        step = pos - length                                  # each row's next new token; < 0: still in its prompt
        live, at = (step >= 0) & ~done, step.clamp(0, N - 1)
        drawn = sample(logits[:, -1].index_fill(-1, special, -torch.inf), u[rows, at], temperature, top_k, top_p)
        out[rows, at] = torch.where(live, drawn, out[rows, at])
        done |= live & ((drawn == c.eos_id) | (step + 1 == N))
        if bool(done.all()):
            break
        fed = torch.where(step < 0, prompt[:, min(pos, prompt.shape[1] - 1)], out[rows, at])  # teacher-forced
        logits = decoder_logits(model, fed.masked_fill(done, c.pad_id)[:, None], cache)
    return out[:, :int((out != c.pad_id).sum(dim=1).max())]
