"""Hugging Face ``MarianMTModel`` holding the canonical weights through ``spec.convert.marian``: encoder-decoder,
post-LN, Marian's options (``spec.convert.marian`` refuses, and this adapter reports as not supported, what
Marian cannot express, such as a LayerNorm epsilon other than 1e-5). See ``certify.adapters.hf_common`` for how it
runs and what is not mapped."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers

from certify.adapters import common, hf_common
from spec.convert import marian

NAME = "MarianMTModel"


class Model(common.Unsupported):
    why = "not mapped onto transformers' generation (certify.adapters.hf_common)"

    def __init__(self, config, model):
        self.config, self.model = config, model

    def _masks(self, src, tgt):
        pad = self.config.pad_id
        return (src != pad).long(), (tgt != pad).long()

    def forward(self, src, tgt_in, intermediates=False, dropout_seed=None):
        """src (B, S), tgt_in (B, T) -> logits (B, T, V) float32."""
        hf_common.no_intermediates(intermediates, dropout_seed)
        src, tgt = common.ids(src), common.ids(tgt_in)
        src_mask, tgt_mask = self._masks(src, tgt)
        with torch.inference_mode():
            out = self.model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt,
                             decoder_attention_mask=tgt_mask)
        return out.logits.float().numpy(), {}

    def encode(self, src):
        src = common.ids(src)
        with torch.inference_mode():
            h = self.model.get_encoder()(input_ids=src, attention_mask=self._masks(src, src)[0])
        return common.host(h.last_hidden_state)

    def decode_steps(self, src, tgt_in, chunks=None, capacity=None):
        """The encoder once, then tgt_in (B, T) in chunks through ``cache`` (``capacity``: transformers'
        cache grows as it goes) -> logits (B, T, V) float32."""
        src, tgt = common.ids(src), common.ids(tgt_in)
        src_mask, tgt_mask = self._masks(src, tgt)
        steps, start, cache = [], 0, None
        with torch.inference_mode():
            memory = self.model.get_encoder()(input_ids=src, attention_mask=src_mask)
            for n in hf_common.chunk_sizes(chunks, tgt.shape[1]):
                out = self.model(encoder_outputs=memory, attention_mask=src_mask,
                                 decoder_input_ids=tgt[:, start:start + n],
                                 decoder_attention_mask=tgt_mask[:, :start + n], cache=cache,
                                 use_cache=True)
                cache, start = out.cache, start + n
                steps.append(out.logits.float().numpy())
        return np.concatenate(steps, axis=1)


class Backend:
    name = NAME
    supports = hf_common.SUPPORTS | {"encoder_decoder", "encode"}

    def load(self, path: Path) -> Model:
        return Model(*hf_common.build(path, marian, transformers.MarianMTModel, transformers.MarianConfig,
                                      "encoder_decoder", NAME))

    def describe(self) -> str:
        return hf_common.describe(NAME)

    sample = staticmethod(common.no_sampling)


def make_backend() -> Backend:
    return Backend()
