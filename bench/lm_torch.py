"""The torch subjects of the decoder-only workloads (``bench.lm_run``): ``impl_torch.LanguageModel`` and Hugging Face
``transformers``' ``GPT2LMHeadModel`` built from a ``GPT2Config`` at the same sizes, random weights.

Everything under ``torch.inference_mode()``; a subject returns once its result is on the host (``.cpu()``; on
CUDA that synchronises). The thread count is ``bench_torch.setup``'s, recorded with the run.
"""

from __future__ import annotations

import numpy as np
import torch

import impl_torch
from bench.bench_torch import DTYPES, NATIVE_BF16
from bench.common import clock
from spec.config import Config


class Ours:
    """``impl_torch.from_params`` through the public API: ``init_cache``/``decode`` and ``generate``."""

    name = "impl_torch"

    def __init__(self, config: Config, params: dict[str, np.ndarray], device: str):
        self.model = impl_torch.from_params(config, params, device=device, native_bf16=NATIVE_BF16)
        self.dtype, self.device = config.dtype, device

    def prefill(self, prompt: np.ndarray) -> None:
        with torch.inference_mode():
            cache = self.model.init_cache(len(prompt), prompt.shape[1])
            self.model.decode(prompt, cache)[0].cpu()                                  # (B, L, V) fp32

    def decode_steps(self, prompt: np.ndarray, n: int, capacity: int) -> list[float]:
        times = []
        with torch.inference_mode():
            cache = self.model.init_cache(len(prompt), capacity)
            logits, cache = self.model.decode(prompt, cache)                           # (B, L, V)
            tokens = logits[:, -1:].argmax(-1).cpu()                                   # (B, 1)
            for _ in range(n):
                start = clock()
                logits, cache = self.model.decode(tokens, cache)                       # (B, 1, V)
                tokens = logits[:, -1:].argmax(-1).cpu()                               # (B, 1)
                times.append(clock() - start)
        return times

    def generate(self, prompt: np.ndarray, n: int) -> np.ndarray:
        with torch.inference_mode():
            return impl_torch.generate(self.model, prompt, n, temperature=0.0).cpu().numpy()   # (B, n)


def ours(config: Config, params: dict[str, np.ndarray], device: str) -> Ours:
    return Ours(config, params, device)


class Peer:
    """``GPT2LMHeadModel`` as a torch user picks it: GPT-2's own layers (learned positions, GELU, biases, the
    tied head), in evaluation mode, its weights in ``dtype`` (``.to(dtype)``), PyTorch's SDPA attention, its
    ``DynamicCache`` and its ``generate`` (greedy: ``do_sample=False``; ``min_new_tokens`` so that every row runs
    the n steps, as ours do with the bench's weights)."""

    name = "transformers.GPT2LMHeadModel"

    def __init__(self, config: Config, device: str):
        from transformers import GPT2Config, GPT2LMHeadModel

        c = config
        gpt2 = GPT2Config(vocab_size=c.vocab_size, n_positions=c.max_len, n_embd=c.d_model, n_layer=c.n_decoder_layers,
                          n_head=c.n_heads, n_inner=c.d_ff, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                          layer_norm_epsilon=c.layer_norm_eps, bos_token_id=c.bos_id, eos_token_id=c.eos_id,
                          pad_token_id=c.pad_id)
        torch.manual_seed(0)
        self.model = GPT2LMHeadModel(gpt2).to(device=device, dtype=DTYPES[c.dtype]).eval()
        self.dtype, self.device = c.dtype, device

    def _ids(self, a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(a, device=self.device)

    def prefill(self, prompt: np.ndarray) -> None:
        with torch.inference_mode():
            self.model(self._ids(prompt), use_cache=True).logits.cpu()                 # (B, L, V)

    def decode_steps(self, prompt: np.ndarray, n: int, capacity: int) -> list[float]:
        """The ``DynamicCache`` grows by concatenation: it has no capacity to set."""
        times = []
        with torch.inference_mode():
            out = self.model(self._ids(prompt), use_cache=True)
            tokens, past = out.logits[:, -1:].argmax(-1).cpu(), out.cache                 # (B, 1)
            for _ in range(n):
                start = clock()
                out = self.model(tokens.to(self.device), cache=past, use_cache=True)
                tokens, past = out.logits[:, -1:].argmax(-1).cpu(), out.cache             # (B, 1)
                times.append(clock() - start)
        return times

    def generate(self, prompt: np.ndarray, n: int) -> np.ndarray:
        ids = self._ids(prompt)
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                                      min_new_tokens=n)
        return out[:, ids.shape[1]:].cpu().numpy()                                     # (B, n)


def peer(config: Config, device: str) -> Peer:
    return Peer(config, device)
