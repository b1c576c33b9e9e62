"""The translation peers (torch's environment): Hugging Face ``MarianMTModel`` and CTranslate2, each holding the
canonical weights of ``bench.translate_common`` so that they compute the same function as ours.

- ``Marian``: ``transformers.MarianMTModel`` from ``spec.convert.marian`` (zero attention and logits biases, the
  paper's positional table, ReLU, the decoder starting at BOS), in evaluation mode, its weights in ``dtype``
  (``.to``), its own ``generate``: greedy, and beam search with its length penalty (score / length^alpha, not
  Wu et al.'s), ``early_stopping=True``; pad and BOS suppressed, as ``spec.search`` never generates them.
- ``CTranslate2``: ``ctranslate2.Translator`` over a model its own converter framework wrote
  (``ctranslate2.converters.Converter`` with the spec's layers: post-LN, ReLU, no biases on the attention, the
  paper's positional table), at a ``compute_type`` of its CPU build ("float32", "int8", ...); tokens are passed
  as strings of a vocabulary with the spec's ids; pad and BOS suppressed (``suppress_sequences``). Its beam
  search is its own: a hypothesis that ends keeps its beam, so its beam translations may differ from ours.
"""

from __future__ import annotations

import tempfile

import numpy as np
import torch

from bench.translate_common import batches
from spec.config import Config
from spec.convert import marian
from spec.reference.layers import positional_encoding


class Marian:
    """``MarianMTModel.generate`` on padded batches (B, S) with an attention mask."""

    def __init__(self, config: Config, params: dict[str, np.ndarray]):
        from transformers import MarianConfig, MarianMTModel

        self.name, self.dtype = "transformers.MarianMTModel", config.dtype
        state = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in marian.to_hf(config, params).items()}
        model = MarianMTModel(MarianConfig(**marian.hf_config(config)))
        model.load_state_dict(state, strict=True)
        self.model = model.to({"bfloat16": torch.bfloat16, "float32": torch.float32}[config.dtype]).eval()
        self.pad, self.special = config.pad_id, [config.pad_id, config.bos_id]

    def search(self, src: np.ndarray, max_new_tokens: int, beam_size: int, alpha: float) -> np.ndarray:
        """src (B, S) -> tokens (B, L): the start token left out."""
        ids = torch.from_numpy(src)
        beam = {"length_penalty": alpha, "early_stopping": True} if beam_size > 1 else {}
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=ids != self.pad, max_new_tokens=max_new_tokens,
                                      num_beams=beam_size, do_sample=False, suppress_tokens=self.special, **beam)
        return out[:, 1:].numpy()


class CTranslate2:
    """``ctranslate2.Translator.translate_batch`` on token strings; ``threads`` intra-op threads, one translator."""

    def __init__(self, config: Config, params: dict[str, np.ndarray], compute_type: str, threads: int):
        import ctranslate2

        self.name, self.dtype, self.config = "ctranslate2", compute_type, config
        self.vocab = _vocabulary(config)
        self._dir = tempfile.TemporaryDirectory()
        _converter(config, params, self.vocab).convert(self._dir.name, quantization=compute_type, force=True)
        self.translator = ctranslate2.Translator(self._dir.name, device="cpu", compute_type=compute_type,
                                                 intra_threads=threads, inter_threads=1)
        self.ids = {token: i for i, token in enumerate(self.vocab)}
        self.special = [[self.vocab[config.pad_id]], [self.vocab[config.bos_id]]]

    def search(self, src: np.ndarray, max_new_tokens: int, beam_size: int, alpha: float) -> np.ndarray:
        """src (B, S) -> tokens (B, L), right-padded."""
        rows = [[self.vocab[t] for t in row if t != self.config.pad_id] for row in src.tolist()]
        results = self.translator.translate_batch(rows, beam_size=beam_size, length_penalty=alpha,
                                                  max_decoding_length=max_new_tokens, suppress_sequences=self.special)
        hyps = [[self.ids[t] for t in r.hypotheses[0]] for r in results]
        return batches(self.config, hyps, len(hyps))[0]


def _vocabulary(config: Config) -> list[str]:
    """Token strings with the spec's ids: pad, BOS and EOS as CTranslate2 names them, then "<unk>" and "w4".. (the
    unknown token is required; no source here holds it)."""
    special = {config.pad_id: "<blank>", config.bos_id: "<s>", config.eos_id: "</s>"}
    free = next(i for i in range(config.vocab_size) if i not in special)
    return [special.get(i, "<unk>" if i == free else f"w{i}") for i in range(config.vocab_size)]


def _converter(config: Config, params: dict[str, np.ndarray], vocab: list[str]):
    """A ``ctranslate2.converters.Converter`` whose model spec holds the canonical ``params``."""
    import ctranslate2
    from ctranslate2.specs import common_spec, transformer_spec

    class Canonical(ctranslate2.converters.Converter):
        def _load(self):
            marian.check_expressible(config)
            model = transformer_spec.TransformerSpec.from_config(
                (config.n_encoder_layers, config.n_decoder_layers), config.n_heads, pre_norm=False,
                no_final_norm=True, activation=common_spec.Activation.RELU)
            _fill(model, config, {k: np.asarray(v, np.float32) for k, v in params.items()})
            model.config.layer_norm_epsilon = config.layer_norm_eps
            model.register_source_vocabulary(vocab)
            model.register_target_vocabulary(vocab)
            return model

    return Canonical()


def _fill(model, config: Config, p: dict[str, np.ndarray]) -> None:
    """Canonical tensors into CTranslate2's spec: Linear weights (out, in), fused Q K V in self-attention, fused
    K V in cross-attention."""
    pe = positional_encoding(config.max_len, config.d_model).astype(np.float32)
    encoder, decoder = model.encoder, model.decoder
    encoder.embeddings[0].weight = decoder.embeddings.weight = decoder.projection.weight = p["embedding"]
    for stack in (encoder, decoder):
        stack.scale_embeddings = True
        stack.position_encodings.encodings = pe
    for i, layer in enumerate(encoder.layer):
        _attention(layer.self_attention, p, f"encoder.layers.{i}.self_attn", [["w_q", "w_k", "w_v"]])
        _ffn(layer.ffn, p, f"encoder.layers.{i}.ffn")
    for i, layer in enumerate(decoder.layer):
        _attention(layer.self_attention, p, f"decoder.layers.{i}.self_attn", [["w_q", "w_k", "w_v"]])
        _attention(layer.attention, p, f"decoder.layers.{i}.cross_attn", [["w_q"], ["w_k", "w_v"]])
        _ffn(layer.ffn, p, f"decoder.layers.{i}.ffn")


def _attention(spec, p: dict[str, np.ndarray], prefix: str, groups: list[list[str]]) -> None:
    for linear, names in zip(spec.linear, groups, strict=False):
        linear.weight = np.concatenate([p[f"{prefix}.{n}"].reshape(p[f"{prefix}.{n}"].shape[0], -1).T
                                        for n in names])                               # (sum H K, D)
    w_o = p[f"{prefix}.w_o"]                                                           # (H, C, D)
    spec.linear[-1].weight = np.ascontiguousarray(w_o.reshape(-1, w_o.shape[-1]).T)    # (D, H C)
    _norm(spec.layer_norm, p, f"{prefix}_norm")


def _ffn(spec, p: dict[str, np.ndarray], prefix: str) -> None:
    spec.linear_0.weight, spec.linear_0.bias = np.ascontiguousarray(p[f"{prefix}.w_1"].T), p[f"{prefix}.b_1"]
    spec.linear_1.weight, spec.linear_1.bias = np.ascontiguousarray(p[f"{prefix}.w_2"].T), p[f"{prefix}.b_2"]
    _norm(spec.layer_norm, p, f"{prefix}_norm")


def _norm(spec, p: dict[str, np.ndarray], prefix: str) -> None:
    spec.gamma, spec.beta = p[f"{prefix}.scale"], p[f"{prefix}.bias"]

