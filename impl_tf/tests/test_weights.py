"""Weights I/O: a bit-exact round trip in both dtypes and through from_params/params_of, the config rule,
and the spec's errors."""

from __future__ import annotations

import re

import numpy as np
import pytest

import impl_tf
from spec.init import init_params
from spec.weights_io import load_weights, save_weights


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_round_trip_is_bit_exact(config, tmp_path, dtype):
    c = config.replace(dtype=dtype, param_dtype=dtype)
    params = init_params(c, 3, observable=True)
    save_weights(tmp_path / "in.safetensors", c, params)
    model = impl_tf.load_weights(tmp_path / "in.safetensors")
    assert model.embedder.table.dtype.name == dtype
    impl_tf.save_weights(model, tmp_path / "out.safetensors")
    c2, back = load_weights(tmp_path / "out.safetensors")
    assert c2 == c and sorted(back) == sorted(params)
    for name, a in params.items():
        assert back[name].dtype == a.dtype and back[name].tobytes() == a.tobytes(), name


def test_wrong_shape_is_named(config, tmp_path):
    params = init_params(config, 0)
    params["decoder.layers.0.ffn.w_1"] = np.zeros((3, 3), params["embedding"].dtype)
    with pytest.raises(ValueError, match=r"parameter 'decoder\.layers\.0\.ffn\.w_1': expected shape"):
        impl_tf.from_params(config, params)


def test_missing_option_parameter_is_named(config):
    """The parameters config options add are required as every other, and refused without their option."""
    c = config.replace(attention_bias=True, logits_bias=True, positions="learned")
    params = init_params(c, 0)
    for name in ("encoder.layers.0.self_attn.b_v", "position_embedding", "logits_bias"):
        with pytest.raises(ValueError, match=re.escape(f"missing parameter '{name}'")):
            impl_tf.from_params(c, {k: a for k, a in params.items() if k != name})
    with pytest.raises(ValueError, match="unexpected parameter 'logits_bias'"):
        impl_tf.from_params(config, {**init_params(config, 0), "logits_bias": params["logits_bias"]})


def test_truncated_file_is_named(config, tmp_path):
    save_weights(tmp_path / "ok.safetensors", config, init_params(config, 0))
    data = (tmp_path / "ok.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cut\.safetensors"):
        impl_tf.load_weights(tmp_path / "cut.safetensors")


def test_params_of_and_from_params_round_trip(config):
    params = init_params(config, 4, observable=True)
    back = impl_tf.params_of(impl_tf.from_params(config, params))
    assert list(back) == list(params)
    for name, a in params.items():
        assert back[name].dtype == a.dtype and back[name].tobytes() == a.tobytes(), name


def test_load_weights_with_a_given_config(config, tmp_path):
    """A given config may differ from the stored one only where the weights do not depend on it."""
    path = tmp_path / "w.safetensors"
    impl_tf.save_weights(impl_tf.Transformer(config, seed=2), path)
    other = config.replace(max_len=32, dropout=0.0)
    with pytest.warns(UserWarning, match="max_len 64 -> 32, dropout 0.1 -> 0.0"):
        assert impl_tf.load_weights(path, other).config == other
    with pytest.raises(ValueError, match="the given config has d_ff=40 but the weights were stored with d_ff=48"):
        impl_tf.load_weights(path, config.replace(d_ff=40))
