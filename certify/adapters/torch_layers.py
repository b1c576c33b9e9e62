"""The layers of ``spec.shapes.LAYERS`` that torch's stock pieces compute alone, whatever the heads' widths, for
``certify.adapters.nn_transformer``'s ``run_layer``: ``F.scaled_dot_product_attention`` (what
``nn.MultiheadAttention`` calls), ``nn.LayerNorm`` of ``x + y`` (the stock layers' post-LN), the stock layers'
FFN ``linear2(activation(linear1(x)))``, the embedding and the tied ``F.linear`` output projection as the user's
code around ``nn.Transformer`` computes them. Inputs arrive in the computing dtype, outputs leave in the dtype torch
gave them."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from certify.adapters import common
from conformance.adapters.base import NotSupported

ALONE = ("scaled_dot_product_attention", "add_norm", "feed_forward", "embedding", "output_projection")


def _t(x: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(np.asarray(x, np.float32)).to(dtype)


def _linear(w: np.ndarray, b: np.ndarray, dtype: torch.dtype) -> nn.Linear:
    m = nn.Linear(*w.shape)
    m.load_state_dict({"weight": torch.from_numpy(np.asarray(w, np.float32).T.copy()),
                       "bias": torch.from_numpy(np.asarray(b, np.float32))})
    return m.to(dtype)


def run(layer: str, stock, params: dict[str, np.ndarray], prefix: str, inputs: dict[str, np.ndarray],
        dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One layer alone with the parameters under ``prefix``; ``stock`` the ``Stock`` module (for the embedding
    and projection). Raises ``NotSupported`` for the layers torch has no piece of alone."""
    i, c = inputs, stock.config
    if layer == "scaled_dot_product_attention":  # (B, T, H, K) -> torch's (B, H, T, K); mask True: may attend
        q, k, v = (_t(i[n], dtype).transpose(1, 2) for n in "qkv")
        return {"out": F.scaled_dot_product_attention(q, k, v, attn_mask=torch.from_numpy(i["mask"]))
                .transpose(1, 2)}
    if layer == "add_norm":
        norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
        norm.load_state_dict({"weight": torch.from_numpy(np.asarray(params[f"{prefix}.scale"], np.float32)),
                              "bias": torch.from_numpy(np.asarray(params[f"{prefix}.bias"], np.float32))})
        return {"out": norm.to(dtype)(_t(i["x"], dtype) + _t(i["y"], dtype))}
    if layer == "feed_forward":
        from certify.adapters.nn_transformer import ACTIVATIONS
        act = ACTIVATIONS[c.activation]
        act = getattr(F, act) if isinstance(act, str) else act
        lin1 = _linear(params[f"{prefix}.w_1"], params[f"{prefix}.b_1"], dtype)
        lin2 = _linear(params[f"{prefix}.w_2"], params[f"{prefix}.b_2"], dtype)
        return {"out": lin2(act(lin1(_t(i["x"], dtype))))}
    if layer == "embedding":
        return {"x": stock.embed(common.ids(i["ids"]))}
    if layer == "output_projection":
        return {"logits": stock.project(_t(i["h"], dtype))}
    raise NotSupported(f"{layer}: the adapter maps onto torch's stock pieces only {', '.join(ALONE)}")
