"""``spec.convert.marian``: which configs Marian can express, and a state dict that holds every canonical tensor
where Marian reads it (the forward's agreement with ``transformers`` is checked where torch is:
``bench/tests/test_translate.py``)."""

from __future__ import annotations

import numpy as np
import pytest

import spec
from spec.convert import marian
from spec.reference.layers import positional_encoding

BASE = spec.preset("base", layer_norm_eps=1e-5)
SMALL = spec.preset("tiny", d_k=8, d_v=8, layer_norm_eps=1e-5, dtype="float32", param_dtype="float32")


def test_the_papers_base_model_with_marians_epsilon_is_expressible():
    marian.check_expressible(BASE)
    kwargs = marian.hf_config(BASE)
    assert kwargs["activation_function"] == "relu" and kwargs["scale_embedding"] is True
    assert (kwargs["d_model"], kwargs["encoder_layers"], kwargs["encoder_attention_heads"]) == (512, 6, 8)
    assert kwargs["decoder_start_token_id"] == BASE.bos_id


@pytest.mark.parametrize("change, field", [
    ({"n_encoder_layers": 0}, "n_encoder_layers=0"),
    ({"norm_first": True}, "norm_first=True"),
    ({"d_k": 32}, "d_k=32"),
    ({"layer_norm_eps": 1e-6}, "layer_norm_eps=1e-06"),
])
def test_what_marian_cannot_express_is_refused_by_name(change, field):
    with pytest.raises(ValueError, match=f"MarianMTModel cannot express this config: .*{field}"):
        marian.to_hf(BASE.replace(**change), {})


def test_a_missing_parameter_is_named():
    params = spec.init_params(SMALL, 0)
    del params["decoder.layers.1.ffn.b_2"]
    with pytest.raises(ValueError, match="params lack 'decoder.layers.1.ffn.b_2'"):
        marian.to_hf(SMALL, params)


def test_every_canonical_tensor_lands_where_marian_reads_it():
    params = spec.init_params(SMALL, 0)
    state = marian.to_hf(SMALL, params)
    assert all(v.dtype == np.float32 for v in state.values())
    D, H, K = SMALL.d_model, SMALL.n_heads, SMALL.d_k
    w_q = params["encoder.layers.0.self_attn.w_q"]                                  # (D, H, K)
    q = state["model.encoder.layers.0.self_attn.q_proj.weight"]                      # (H K, D)
    assert q.shape == (H * K, D) and np.array_equal(q[3 * K + 1], w_q[:, 3, 1])     # head 3, column 1
    w_o = params["decoder.layers.1.cross_attn.w_o"]                                 # (H, C, D)
    o = state["model.decoder.layers.1.encoder_attn.out_proj.weight"]                 # (D, H C)
    assert np.array_equal(o[:, 2 * K + 5], w_o[2, 5])
    assert np.array_equal(state["model.decoder.layers.1.fc2.weight"], params["decoder.layers.1.ffn.w_2"].T)
    assert np.array_equal(state["model.decoder.layers.0.encoder_attn_layer_norm.weight"],
                          params["decoder.layers.0.cross_attn_norm.scale"])
    assert not any(state[k].any() for k in state if k.endswith(("_proj.bias", "final_logits_bias")))
    table = params["embedding"]
    for name in ("model.shared.weight", "lm_head.weight", "model.decoder.embed_tokens.weight"):
        assert np.array_equal(state[name], table)
    pe = state["model.encoder.embed_positions.weight"]
    assert np.array_equal(pe, positional_encoding(SMALL.max_len, D).astype(np.float32))   # interleaved sin, cos
    # the shared table 4 times, the logits bias, 2 positional tables; per layer 16 (encoder) or 26 (decoder)
    assert len(state) == 7 + 16 * SMALL.n_encoder_layers + 26 * SMALL.n_decoder_layers
