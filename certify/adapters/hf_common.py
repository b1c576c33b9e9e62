"""What the Hugging Face adapters share: a ``transformers`` model built from a canonical weights file through
``spec.convert`` (the library's own class, config and state dict), run as a user runs it: evaluation mode,
``torch.inference_mode()``, the attention implementation ``transformers`` picks by default, bf16 as
``model.to(torch.bfloat16)``; key padding masks as ``attention_mask``; the KV cache as their ``cache`` argument.

Not mapped: ``generate`` and search (``transformers``' generation stops, pads and forbids tokens by its own rules,
not ``spec.search``'s), the spec's intermediate tensors, dropout, training, layers alone, the spec's
``ValueError`` on bad ids.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from certify.adapters import common
from conformance.adapters.base import NotSupported
from spec.config import Config
from spec.weights_io import load_weights

SUPPORTS = frozenset({"float32", "bfloat16", "forward", "cache"})


def build(path: Path, convert, model_class, config_class, kind: str, who: str) -> tuple[Config, torch.nn.Module]:
    """(config, the library's model holding the weights at ``path``, in the config's dtype, evaluation mode).

    Raises:
        NotSupported: naming what ``convert`` (a ``spec.convert`` module) says the library cannot express.
    """
    config, params = load_weights(path)
    common.require(config, ("float32", "bfloat16"), (kind,), who)
    try:
        hf = config_class(**convert.hf_config(config))
    except ValueError as e:
        raise NotSupported(str(e)) from e
    model = model_class(hf)
    state = {k: torch.from_numpy(v) for k, v in convert.to_hf(config, params).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k not in state]:
        raise RuntimeError(f"{who}: state dict mismatch: missing {missing}, unexpected {unexpected}")
    return config, model.to(common.TORCH_DTYPES[config.dtype]).eval()


def describe(who: str) -> str:
    return common.describe(f"{who} (bf16 by model.to)", f"transformers {transformers.__version__}")


def no_intermediates(intermediates: bool, dropout_seed) -> None:
    """Raise ``NotSupported`` for what ``forward`` does not map: the spec's named tensors, dropout draws."""
    if intermediates:
        raise NotSupported("the spec's intermediate tensors are not mapped onto transformers' hidden states")
    if dropout_seed is not None:
        raise NotSupported("transformers' dropout draws from torch's global RNG, not a given seed")


def chunk_sizes(chunks, T: int) -> list[int]:
    return list(chunks) if chunks is not None else [1] * T
