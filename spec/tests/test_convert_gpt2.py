"""``spec.convert.gpt2``: which configs GPT-2 can express, its fused and transposed projections, the rows its
special tokens need, and the way back (the forward's agreement with ``transformers`` in every backend:
``tools/tests/test_convert_hf.py``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import spec
from spec.convert import gpt2, hub

GPT2 = spec.preset("lm_tiny", d_k=8, d_v=8, activation="gelu_tanh", attention_bias=True, positions="learned",
                   scale_embedding=False, layer_norm_eps=1e-5, dtype="float32", param_dtype="float32")


@pytest.mark.parametrize("change, field", [
    ({"n_encoder_layers": 2}, "n_encoder_layers=2"),
    ({"norm_first": False}, "norm_first=False"),
    ({"d_k": 16}, "d_k=16"),
    ({"scale_embedding": True}, "scale_embedding=True"),
    ({"logits_bias": True}, "logits_bias=True"),
])
def test_what_gpt2_cannot_express_is_refused_by_name(change, field):
    with pytest.raises(ValueError, match=f"GPT2LMHeadModel cannot express this config: .*{field}"):
        gpt2.to_hf(GPT2.replace(**change), {})


def test_the_fused_projection_holds_queries_keys_and_values_head_by_head():
    params = spec.init_params(GPT2, 0, observable=True)
    state = gpt2.to_hf(GPT2, params)
    D, K = GPT2.d_model, GPT2.d_k
    c_attn = state["transformer.h.1.attn.c_attn.weight"]                            # (D, 3 D): q | k | v
    assert np.array_equal(c_attn[:, D + 2 * K + 3], params["decoder.layers.1.self_attn.w_k"][:, 2, 3])
    b_v = params["decoder.layers.1.self_attn.b_v"]                                   # (H, C)
    assert state["transformer.h.1.attn.c_attn.bias"][2 * D + K] == b_v[1, 0]
    w_o = params["decoder.layers.0.self_attn.w_o"]                                   # (H, C, D)
    assert np.array_equal(state["transformer.h.0.attn.c_proj.weight"][K + 1], w_o[1, 1])
    assert np.array_equal(state["transformer.ln_f.weight"], params["decoder.final_norm.scale"])


@pytest.mark.parametrize("config", [GPT2, GPT2.replace(attention_bias=False, positions="sinusoidal")],
                         ids=["gpt2", "paper_positions"])
def test_a_saved_model_loads_back(config, tmp_path):
    params = spec.init_params(config, 1, observable=True)
    gpt2.save(tmp_path, config, params)
    loaded, back = gpt2.load(tmp_path)
    assert loaded == config.replace(attention_bias=True, positions="learned")   # what GPT-2 always has
    for name, value in back.items():
        expected = params.get(name, 0.0 if ".b_" in name else None)
        if name == "position_embedding" and config.positions != "learned":
            expected = spec.reference.positional_encoding(config.max_len, config.d_model)
        assert np.array_equal(value, np.broadcast_to(np.asarray(expected, np.float32), value.shape)), name


def test_endoftext_as_bos_and_eos_and_no_pad_get_rows_of_their_own():
    params = spec.init_params(GPT2, 1)
    hf = {"model_type": "gpt2", **gpt2.hf_config(GPT2), "bos_token_id": 2, "eos_token_id": 2, "pad_token_id": None}
    config, back = gpt2.from_hf(hf, gpt2.to_hf(GPT2, params))
    V = GPT2.vocab_size
    assert (config.vocab_size, config.pad_id, config.bos_id, config.eos_id) == (V + 2, V, V + 1, 2)
    assert not back["embedding"][V].any() and np.array_equal(back["embedding"][V + 1], params["embedding"][2])
    assert config.logits_bias and list(back["logits_bias"][V:]) == [hub.NEVER] * 2 and not back["logits_bias"][:V].any()


def test_an_unknown_architecture_is_refused_by_name(tmp_path):
    gpt2.save(tmp_path, GPT2, spec.init_params(GPT2, 1))
    hf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(hf | {"model_type": "gpt_neox"}))
    with pytest.raises(ValueError, match="unknown architecture: model_type='gpt_neox'"):
        gpt2.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(hf | {"scale_attn_by_inverse_layer_idx": True}))
    with pytest.raises(ValueError, match="cannot express this GPT-2 config: scale_attn_by_inverse_layer_idx=True"):
        gpt2.load(tmp_path)
