"""``spec.convert.marian``: which configs Marian can express, a state dict that holds every canonical tensor where
Marian reads it, the way back, and what a checkpoint folder may hold that is refused (the forward's agreement with
``transformers`` in every backend is checked where the frameworks are: ``tools/tests/test_convert_hf.py``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import spec
from spec.convert import hub, marian
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


MARIAN = SMALL.replace(activation="silu", attention_bias=True, logits_bias=True, positions="sinusoidal_halves")


@pytest.mark.parametrize("config", [SMALL, MARIAN, SMALL.replace(positions="learned", activation="gelu_tanh")],
                         ids=["paper", "marian", "learned"])
def test_a_saved_model_loads_back_as_it_was(config, tmp_path):
    params = spec.init_params(config, 1, observable=True)
    marian.save(tmp_path, config, params)
    loaded, back = marian.load(tmp_path)
    assert loaded == config
    assert list(back) == list(params) and all(np.array_equal(back[k], params[k]) for k in params)


def test_marians_start_token_gets_a_row_of_its_own(tmp_path):
    """Marian starts decoding at its pad token, which the spec masks: BOS becomes a copy of that row."""
    params = spec.init_params(MARIAN, 1, observable=True)
    state = marian.to_hf(MARIAN, params)
    hf = {"model_type": "marian", **marian.hf_config(MARIAN), "decoder_start_token_id": MARIAN.pad_id}
    config, back = marian.from_hf(hf, state)
    V = MARIAN.vocab_size
    assert (config.vocab_size, config.bos_id, config.pad_id) == (V + 1, V, MARIAN.pad_id)
    assert np.array_equal(back["embedding"][V], params["embedding"][MARIAN.pad_id])
    assert back["logits_bias"][V] == hub.NEVER and np.array_equal(back["logits_bias"][:V], params["logits_bias"])


def _saved(tmp_path):
    marian.save(tmp_path, MARIAN, spec.init_params(MARIAN, 1))
    return tmp_path


def test_a_truncated_weights_file_is_refused_by_name(tmp_path):
    path = _saved(tmp_path) / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match="model.safetensors: not a whole safetensors file"):
        marian.load(tmp_path)


def test_a_config_that_does_not_match_the_tensors_is_refused_by_name(tmp_path):
    hf = json.loads((_saved(tmp_path) / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(hf | {"encoder_ffn_dim": 64, "decoder_ffn_dim": 64}))
    with pytest.raises(ValueError, match=r"fc1.weight: shape \(48, 32\), but config.json gives \(64, 32\)"):
        marian.load(tmp_path)


@pytest.mark.parametrize("change, message", [
    ({"model_type": "bert", "architectures": ["BertModel"]}, "unknown architecture: model_type='bert'"),
    ({"activation_function": "mish"}, "activation_function='mish'"),
    ({"decoder_ffn_dim": 64}, "encoder_ffn_dim=48 != decoder_ffn_dim=64"),
    ({"share_encoder_decoder_embeddings": False}, "share_encoder_decoder_embeddings=False"),
])
def test_what_the_spec_cannot_express_is_refused_by_name(change, message, tmp_path):
    hf = json.loads((_saved(tmp_path) / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(hf | change))
    with pytest.raises(ValueError, match=message):
        marian.load(tmp_path)


def test_a_folder_without_safetensors_is_refused_by_name(tmp_path):
    (_saved(tmp_path) / "model.safetensors").rename(tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="no such file .only pytorch_model.bin"):
        marian.load(tmp_path)
