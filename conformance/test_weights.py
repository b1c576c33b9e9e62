"""Weights I/O through the backend: a bit-exact round trip, and the spec's errors on bad files."""

from __future__ import annotations

import numpy as np
import pytest
import safetensors.numpy

from spec import golden_cases
from spec.config import TINY
from spec.init import init_params
from spec.weights_io import load_weights, save_weights


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_weights_round_trip_bit_exact(dtype, backend, tmp_path):
    c = TINY.replace(dtype=dtype, param_dtype=dtype)
    params = golden_cases.make_params(c, 31)
    save_weights(tmp_path / "in.safetensors", c, params)
    backend.load(tmp_path / "in.safetensors").save(tmp_path / "out.safetensors")
    c2, back = load_weights(tmp_path / "out.safetensors")
    assert c2 == c
    assert sorted(back) == sorted(params)
    for name, a in params.items():
        assert back[name].dtype == a.dtype, name
        assert back[name].tobytes() == a.tobytes(), f"{name}: bits differ after the round trip"


def _write(path, c, tensors):
    safetensors.numpy.save_file(tensors, str(path), metadata={"config": c.to_json()})


def _missing(p):
    del p["decoder.layers.1.ffn.b_2"]


def _unexpected(p):
    p["encoder.layers.0.ffn.b_3"] = p["encoder.layers.0.ffn.b_2"].copy()


def _wrong_shape(p):
    p["encoder.layers.1.self_attn.w_q"] = p["encoder.layers.1.self_attn.w_q"][:, :, :-1].copy()


def _wrong_dtype(p):
    p["decoder.layers.0.cross_attn_norm.scale"] = p["decoder.layers.0.cross_attn_norm.scale"].astype(np.float32)


def _non_finite(p):
    a = p["embedding"].copy()
    a[5, 3] = np.inf
    p["embedding"] = a


@pytest.mark.needs("errors")
@pytest.mark.parametrize("corrupt, pattern", [
    (_missing, r"missing parameter 'decoder\.layers\.1\.ffn\.b_2'"),
    (_unexpected, r"unexpected parameter 'encoder\.layers\.0\.ffn\.b_3'"),
    (_wrong_shape, r"parameter 'encoder\.layers\.1\.self_attn\.w_q': expected shape"),
    (_wrong_dtype, r"parameter 'decoder\.layers\.0\.cross_attn_norm\.scale': expected dtype bfloat16"),
    (_non_finite, r"parameter 'embedding': holds non-finite values"),
], ids=["missing", "unexpected", "wrong_shape", "wrong_dtype", "non_finite"])
def test_bad_weights_file(corrupt, pattern, backend, tmp_path):
    params = init_params(TINY, 0)
    corrupt(params)
    _write(tmp_path / "bad.safetensors", TINY, params)
    with pytest.raises(ValueError, match=pattern):
        backend.load(tmp_path / "bad.safetensors")


@pytest.mark.needs("errors")
def test_truncated_weights_file(backend, tmp_path):
    save_weights(tmp_path / "ok.safetensors", TINY, init_params(TINY, 0))
    data = (tmp_path / "ok.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cut\.safetensors"):
        backend.load(tmp_path / "cut.safetensors")


@pytest.mark.needs("errors")
@pytest.mark.parametrize("metadata, pattern", [
    ({"config": "{not json"}, r"bad\.safetensors: the 'config' metadata is not valid JSON"),
    ({"config": "[1, 2]"}, r"bad\.safetensors: the 'config' metadata is not a JSON object"),
    ({"config": '{"vocab_size": 61}'}, r"bad\.safetensors: invalid config in the metadata"),
], ids=["config_not_json", "config_not_an_object", "config_incomplete"])
def test_bad_config_metadata(metadata, pattern, backend, tmp_path):
    safetensors.numpy.save_file(init_params(TINY, 0), str(tmp_path / "bad.safetensors"), metadata=metadata)
    with pytest.raises(ValueError, match=pattern):
        backend.load(tmp_path / "bad.safetensors")
