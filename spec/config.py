"""Model configuration and presets (Vaswani et al., 2017, section 3 and Table 3).

Shape letters used throughout the project:
    B batch, S source length, T target length, D d_model, H n_heads,
    K d_k, C d_v, F d_ff, V vocab_size, L a generated length (search output),
    P a KV cache's capacity, n positions fed in one decode call.
Layer counts are spelled out (n_encoder_layers), never a letter.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

DTYPES = ("bfloat16", "float32")
# The FFN's nonlinearity: the paper's ReLU (equation 2); GELU (Hendrycks & Gimpel, 2016) exact (erf) or with its
# tanh approximation (GPT-2's "gelu_new"); SiLU, x sigmoid(x) (Marian's "swish").
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")
# Where positions come from: the paper's sinusoidal table with sin and cos interleaved (section 3.5), the same
# frequencies with every sin first and every cos after (Marian's layout), or a learned (max_len, D) table (GPT-2).
POSITIONS = ("sinusoidal", "sinusoidal_halves", "learned")


@dataclasses.dataclass(frozen=True)
class Config:
    """Hyper-parameters of the encoder-decoder Transformer, or of the decoder-only language model.

    Field names follow the paper. ``n_encoder_layers=0`` is the decoder-only model (``decoder_only``): the decoder
    stack without cross-attention sublayers, over one token sequence (Radford et al., 2018; Liu et al., 2018),
    the model of ``LanguageModel`` in every impl; ``pad_id`` then pads prompts and batches, and ``bos_id``/``eos_id``
    are the tokens a text starts and ends with. ``norm_first=False`` is the paper's post-LN
    block ``LayerNorm(x + Sublayer(x))`` (section 3.1, 5.4); ``True`` is the
    pre-LN variant ``x + Sublayer(LayerNorm(x))`` with a final LayerNorm on each
    stack. ``dtype`` is the dtype of activations between sublayers and
    ``param_dtype`` the dtype parameters are stored in; see ``spec.numerics``.

    The options published checkpoints need (``spec.convert``), each the paper's choice by default: ``activation``
    (``ACTIVATIONS``), ``attention_bias`` (biases on the four attention projections), ``logits_bias`` (a bias on
    the logits), ``positions`` (``POSITIONS``) and ``scale_embedding`` (the embedding times sqrt(d_model),
    section 3.4).

    Raises:
        ValueError: naming the field and the rule broken, from ``__post_init__``.
    """

    vocab_size: int
    d_model: int
    n_heads: int
    d_k: int
    d_v: int
    d_ff: int
    n_encoder_layers: int
    n_decoder_layers: int
    max_len: int
    dropout: float
    layer_norm_eps: float = 1e-6
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    norm_first: bool = False
    activation: str = "relu"
    attention_bias: bool = False
    logits_bias: bool = False
    positions: str = "sinusoidal"
    scale_embedding: bool = True
    dtype: str = "bfloat16"
    param_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        positive = ("vocab_size", "d_model", "n_heads", "d_k", "d_v", "d_ff", "max_len")
        for name in positive:
            _require(name, _is_int(getattr(self, name)) and getattr(self, name) > 0, "must be a positive int")
        _require("n_encoder_layers", _is_int(self.n_encoder_layers) and self.n_encoder_layers >= 0,
                 "must be an int >= 0 (0: decoder-only)")
        _require("n_decoder_layers", _is_int(self.n_decoder_layers) and self.n_decoder_layers >= 1,
                 "must be an int >= 1")
        _require("d_model", self.d_model % 2 == 0, "must be even (sinusoidal encoding pairs sin and cos)")
        _require("dropout", isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0, "must lie in [0, 1)")
        _require("layer_norm_eps", isinstance(self.layer_norm_eps, float) and self.layer_norm_eps > 0.0,
                 "must be a positive float")
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            _require(name, _is_int(value) and 0 <= value < self.vocab_size,
                     f"must be an int in [0, vocab_size={self.vocab_size})")
        ids = {"pad_id": self.pad_id, "bos_id": self.bos_id, "eos_id": self.eos_id}
        _require("pad_id", len(set(ids.values())) == 3, f"pad_id, bos_id and eos_id must differ, got {ids}")
        for name in ("norm_first", "attention_bias", "logits_bias", "scale_embedding"):
            _require(name, isinstance(getattr(self, name), bool), "must be a bool")
        _require("activation", self.activation in ACTIVATIONS, f"must be one of {ACTIVATIONS}, got {self.activation!r}")
        _require("positions", self.positions in POSITIONS, f"must be one of {POSITIONS}, got {self.positions!r}")
        for name in ("dtype", "param_dtype"):
            _require(name, getattr(self, name) in DTYPES, f"must be one of {DTYPES}, got {getattr(self, name)!r}")

    @property
    def decoder_only(self) -> bool:
        """True for the decoder-only language model (``n_encoder_layers == 0``)."""
        return self.n_encoder_layers == 0

    def replace(self, **changes: Any) -> Config:
        """A copy with ``changes`` applied and validated again."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Config:
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"Config: unknown fields {unknown}")
        return cls(**d)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _require(field: str, ok: bool, rule: str) -> None:
    if not ok:
        raise ValueError(f"Config.{field} {rule}")


# Paper Table 3, "base": N=6, d_model=512, d_ff=2048, h=8, d_k=d_v=64, P_drop=0.1.
# Vocabulary: the shared 37000-token BPE vocabulary of WMT 2014 En-De (section 5.1).
BASE = Config(vocab_size=37000, d_model=512, n_heads=8, d_k=64, d_v=64, d_ff=2048,
              n_encoder_layers=6, n_decoder_layers=6, max_len=512, dropout=0.1)
# Paper Table 3, "big": d_model=1024, d_ff=4096, h=16, P_drop=0.3.
BIG = BASE.replace(d_model=1024, n_heads=16, d_ff=4096, dropout=0.3)
# For tests: every dimension distinct where the paper's are equal (d_k != d_v,
# S != T in the cases) so a transposed axis cannot pass by accident; d_k = 16
# keeps 1/sqrt(d_k) a power of two, like the paper's 64.
TINY = Config(vocab_size=61, d_model=32, n_heads=4, d_k=16, d_v=8, d_ff=48,
              n_encoder_layers=2, n_decoder_layers=2, max_len=64, dropout=0.1)

# Between tiny and base, for learning real text on a CPU (the text package's translation demo): base's shape at a
# quarter of its width and half its depth, 8000 shared subwords, fp32 master weights computing in bf16.
MINI = Config(vocab_size=8000, d_model=256, n_heads=4, d_k=64, d_v=64, d_ff=1024, n_encoder_layers=3,
              n_decoder_layers=3, max_len=256, dropout=0.1, param_dtype="float32")

# Decoder-only language models (``decoder_only``), pre-LN with a final LayerNorm as GPT-2 is. lm_tiny: tiny's
# layers without the encoder. gpt2_small: the size of GPT-2 small (Radford et al., 2019: 12 layers, d_model 768,
# 12 heads, d_ff 3072, a 1024-token context, 50257 byte-level BPE tokens), with this paper's layers (sinusoidal
# positions, ReLU, no attention biases, the embedding scaled by sqrt(d_model)): its size, not its weights.
LM_TINY = TINY.replace(n_encoder_layers=0, norm_first=True)
GPT2_SMALL = Config(vocab_size=50257, d_model=768, n_heads=12, d_k=64, d_v=64, d_ff=3072, n_encoder_layers=0,
                    n_decoder_layers=12, max_len=1024, dropout=0.1, norm_first=True)

PRESETS: dict[str, Config] = {"base": BASE, "big": BIG, "gpt2_small": GPT2_SMALL, "lm_tiny": LM_TINY, "mini": MINI,
                              "tiny": TINY}


def preset(name: str, **changes: Any) -> Config:
    """The preset ``name`` (``PRESETS``: "base", "big", "mini", "tiny"; decoder-only "lm_tiny", "gpt2_small") with
    optional ``changes``."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name].replace(**changes)
