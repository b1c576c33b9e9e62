"""Hugging Face ``GPT2LMHeadModel`` holding the canonical weights through ``spec.convert.gpt2``: decoder-only,
pre-LN, GPT-2's options (``spec.convert.gpt2`` refuses, and this adapter reports as not supported, what GPT-2
cannot express). See ``certify.adapters.hf_common`` for how it runs and what is not mapped."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers

from certify.adapters import common, hf_common
from spec.convert import gpt2

NAME = "GPT2LMHeadModel"


class Model(common.Unsupported):
    why = "not mapped onto transformers' generation (certify.adapters.hf_common)"

    def __init__(self, config, model):
        self.config, self.model = config, model

    def forward(self, src, tgt_in, intermediates=False, dropout_seed=None):
        """tokens (B, T) (``src`` None) -> logits (B, T, V) float32."""
        hf_common.no_intermediates(intermediates, dropout_seed)
        tokens = common.ids(tgt_in)
        with torch.inference_mode():
            out = self.model(input_ids=tokens, attention_mask=(tokens != self.config.pad_id).long())
        return out.logits.float().numpy(), {}

    def decode_steps(self, src, tgt_in, chunks=None, capacity=None):
        """tokens (B, T) fed in chunks through ``cache`` (``capacity``: transformers' cache grows as it
        goes) -> logits (B, T, V) float32."""
        tokens, steps, start, cache = common.ids(tgt_in), [], 0, None
        with torch.inference_mode():
            for n in hf_common.chunk_sizes(chunks, tokens.shape[1]):
                seen = (tokens[:, :start + n] != self.config.pad_id).long()
                out = self.model(input_ids=tokens[:, start:start + n], attention_mask=seen, cache=cache,
                                 use_cache=True)
                cache, start = out.cache, start + n
                steps.append(out.logits.float().numpy())
        return np.concatenate(steps, axis=1)


class Backend:
    name = NAME
    supports = hf_common.SUPPORTS | {"decoder_only"}

    def load(self, path: Path) -> Model:
        return Model(*hf_common.build(path, gpt2, transformers.GPT2LMHeadModel, transformers.GPT2Config,
                                      "decoder_only", NAME))

    def describe(self) -> str:
        return hf_common.describe(NAME)

    sample = staticmethod(common.no_sampling)


def make_backend() -> Backend:
    return Backend()
