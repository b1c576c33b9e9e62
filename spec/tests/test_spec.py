"""Config, schema, init, weights I/O, validation, FLOPs, tolerance and golden files."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import safetensors.numpy
from hypothesis import given
from hypothesis import strategies as st

from spec import flops, golden_cases, golden_recipes, schema, tolerance, validate
from spec.config import BASE, BIG, TINY, Config, preset
from spec.init import init_params
from spec.numerics import BF16
from spec.weights_io import load_weights, save_weights


def test_presets_follow_table_3():
    assert (BASE.d_model, BASE.n_heads, BASE.d_k, BASE.d_v, BASE.d_ff, BASE.dropout) == (512, 8, 64, 64, 2048, 0.1)
    assert (BIG.d_model, BIG.n_heads, BIG.d_ff, BIG.dropout) == (1024, 16, 4096, 0.3)
    assert BASE.n_encoder_layers == BASE.n_decoder_layers == 6 and BASE.layer_norm_eps == 1e-6
    assert preset("tiny") == TINY and BASE.dtype == BASE.param_dtype == "bfloat16"


@pytest.mark.parametrize("field, value, message", [
    ("d_model", 0, "Config.d_model must be a positive int"),
    ("d_model", 33, "Config.d_model must be even"),
    ("n_heads", 2.0, "Config.n_heads must be a positive int"),
    ("n_encoder_layers", -1, "Config.n_encoder_layers must be an int >= 0"),
    ("dropout", 1.0, "Config.dropout must lie in"),
    ("layer_norm_eps", 0.0, "Config.layer_norm_eps must be a positive float"),
    ("pad_id", 61, "Config.pad_id must be an int in"),
    ("eos_id", 0, "Config.pad_id pad_id, bos_id and eos_id must differ"),
    ("dtype", "float16", "Config.dtype must be one of"),
    ("norm_first", 1, "Config.norm_first must be a bool"),
])
def test_config_validation_names_field_and_rule(field, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        TINY.replace(**{field: value})


@given(st.dictionaries(st.sampled_from(["d_model", "n_heads", "d_ff", "vocab_size", "max_len"]),
                       st.integers(-3, 40), max_size=3))
def test_config_either_valid_or_value_error(changes):
    try:
        c = TINY.replace(**changes)
    except ValueError as e:
        assert str(e).startswith("Config.")
    else:
        assert Config.from_dict(c.to_dict()) == c


def test_base_parameter_count_itemised():
    emb = 37000 * 512
    attn, norm, ffn = 4 * 512 * 512, 2 * 512, 2 * 512 * 2048 + 2048 + 512
    assert schema.param_count(BASE) == emb + 6 * (attn + ffn + 2 * norm) + 6 * (2 * attn + ffn + 3 * norm)
    assert schema.param_count(BASE) == 63_045_632


def test_pre_ln_adds_final_norms():
    names = {s.name for s in schema.param_specs(TINY.replace(norm_first=True))}
    assert {"encoder.final_norm.scale", "decoder.final_norm.bias"} <= names
    assert not any("final_norm" in s.name for s in schema.param_specs(TINY))


def test_init_is_deterministic_and_follows_the_paper():
    a, b = init_params(BASE.replace(n_encoder_layers=1, n_decoder_layers=1), 0), init_params(TINY, 0)
    assert abs(float(np.var(a["embedding"].astype(np.float64))) * 512 - 1.0) < 0.01  # variance 1/d_model
    w = a["encoder.layers.0.ffn.w_1"].astype(np.float64)
    assert np.abs(w).max() <= np.sqrt(6 / (512 + 2048)) and np.abs(w).max() > 0.99 * np.sqrt(6 / (512 + 2048))
    assert (a["encoder.layers.0.ffn.b_1"] == 0).all() and (a["decoder.layers.0.ffn_norm.scale"] == 1).all()
    assert all(v.dtype == BF16 for v in b.values())
    # Identical bits on every platform: pinned digest of one tensor.
    digest = hashlib.sha256(b["encoder.layers.1.self_attn.w_q"].tobytes()).hexdigest()
    assert digest == INIT_DIGEST, digest
    assert golden_cases.params_digest(b) == golden_cases.params_digest(init_params(TINY, 0))


INIT_DIGEST = "2c4e0f9d7dcedd434227d734e1b89ab14282ee8adf7d9110d16d4361f4e825d9"  # TINY, seed 0


def test_observable_init_moves_biases_and_scales():
    p = init_params(TINY, 0, observable=True)
    assert (p["encoder.layers.0.ffn.b_1"] != 0).mean() > 0.9
    s = p["decoder.layers.1.ffn_norm.scale"].astype(np.float64)
    assert s.min() >= 0.5 and s.max() <= 1.5 and np.abs(s - 1).mean() > 0.1


def test_weights_round_trip_and_errors(tmp_path):
    c = TINY.replace(dtype="float32", param_dtype="float32")
    p = init_params(c, 1)
    save_weights(tmp_path / "w.safetensors", c, p)
    c2, back = load_weights(tmp_path / "w.safetensors")
    assert c2 == c and all(back[k].tobytes() == v.tobytes() for k, v in p.items())
    with pytest.raises(ValueError, match="param_dtype='bfloat16' but the weights were stored with param_dtype="):
        load_weights(tmp_path / "w.safetensors", c.replace(param_dtype="bfloat16"))
    with pytest.warns(UserWarning, match="max_len 64 -> 32, dropout 0.1 -> 0.0"):
        c3, _ = load_weights(tmp_path / "w.safetensors", c.replace(max_len=32, dropout=0.0))
    assert c3 == c.replace(max_len=32, dropout=0.0)
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="junk.safetensors"):
        load_weights(tmp_path / "junk.safetensors")


def test_validation_messages():
    with pytest.raises(ValueError, match="src: token id 61 outside"):
        validate.check_source(np.array([[3, 61]]), TINY)
    with pytest.raises(ValueError, match="src: sequence 0 is all padding"):
        validate.check_source(np.array([[0, 0]]), TINY)
    assert validate.generation_limits(np.array([[3, 4, 0], [5, 0, 0]]), TINY, None).tolist() == [52, 51]
    with pytest.raises(ValueError, match="max_new_tokens must be a positive int"):
        validate.generation_limits(np.array([[3]]), TINY, True)


def test_flops_by_hand():
    c = TINY
    B, S, T = 2, 3, 4
    D, HK, HC, F, V = 32, 64, 32, 48, 61
    attn = lambda n, m: 2 * B * (n * D * HK + m * D * HK + m * D * HC + n * HC * D) + 2 * B * n * m * (HK + HC)  # noqa: E731
    ffn = lambda n: 4 * B * n * D * F  # noqa: E731
    expected = 2 * (attn(S, S) + ffn(S)) + 2 * (attn(T, T) + attn(T, S) + ffn(T)) + 2 * B * T * D * V
    assert flops.forward_flops(c, B, S, T) == expected
    assert flops.train_step_flops(c, B, S, T) == 3 * expected


def test_tolerance_judge():
    x = np.linspace(-2, 2, 101)
    faithful = tolerance.error_stats(x.astype(BF16).astype(np.float64), x, "bfloat16")
    assert tolerance.judge(x.astype(BF16), x, faithful).ok
    assert not tolerance.judge(x + 0.1, x, faithful).ok
    assert not tolerance.judge(np.where(x > 1.9, np.nan, x), x, faithful).ok


def test_golden_files_reproduce_bit_for_bit():
    assert golden_recipes.check() == []


def test_a_regeneration_may_differ_by_float64_noise_only(tmp_path):
    """What ``check`` accepts from another CPU: float64 values moved by under 1e-9 of their tensor's scale and
    statistics by under 1e-6 relative; nothing else."""
    x = np.array([[0.25, -3.0], [1e-12, np.nan]])
    mask = np.array([True, False])
    close = golden_recipes.close_up_to_noise
    assert close(x + 1e-10, x) and not close(x + 1e-8, x) and not close(np.nan_to_num(x), x)
    assert not close(x.astype(np.float32), x) and not close(~mask, mask) and close(mask.copy(), mask)
    def write(name, tensors):
        safetensors.numpy.save_file(tensors, str(tmp_path / name))
        return tmp_path / name
    same = golden_recipes.same_up_to_noise
    assert same(write("a.safetensors", {"x": x + 1e-10}), write("b.safetensors", {"x": x}))
    assert not same(write("c.safetensors", {"y": x}), tmp_path / "b.safetensors")
    meta = {"tensors": {"x": {"max_eps": 2.5, "undecided": 3}}, "sha256": {"b.safetensors": "0" * 64}}
    moved = {"tensors": {"x": {"max_eps": 2.5 * (1 + 1e-8), "undecided": 3}}, "sha256": {"b.safetensors": "1" * 64}}
    (tmp_path / "m.json").write_text(json.dumps(meta))
    for change, ok in ((moved, True), ({**moved, "tensors": {"x": {"max_eps": 2.6, "undecided": 3}}}, False),
                       ({**moved, "tensors": {"x": {"max_eps": 2.5, "undecided": 4}}}, False)):
        (tmp_path / "n.json").write_text(json.dumps(change))
        assert same(tmp_path / "n.json", tmp_path / "m.json") == ok, change


def test_recording_scopes_and_no_op():
    from spec.recording import record, recording, scope
    x = object()
    with scope("encoder"):
        assert record("out", x) is x                       # nothing records: a no-op
    with recording() as outer:
        with scope("encoder"), scope("layers.0"):
            record("out", x)
        with recording() as inner:
            record("logits", x)
    assert outer == {"encoder.layers.0.out": x} and inner == {"logits": x}


@pytest.mark.parametrize("n, want", [(1, 8), (3, 8), (8, 8), (9, 16), (33, 64), (64, 64)])
def test_length_buckets(n, want):
    from spec.shapes import length_bucket
    assert length_bucket(n, 64) == want
    assert length_bucket(n, 40) == min(want, 40)


def test_batch_buckets_and_padding():
    from spec.shapes import batch_bucket, pad_ids
    assert [batch_bucket(n) for n in (1, 2, 3, 4, 5, 9)] == [1, 2, 4, 4, 8, 16]
    out = pad_ids(np.array([[5, 6], [7, 2]]), 4, 3, 0)
    assert out.dtype == np.int32 and out.tolist() == [[5, 6, 0], [7, 2, 0], [0, 0, 0], [0, 0, 0]]
