"""Weights I/O: a bit-exact round trip in both dtypes, and the spec's errors."""

from __future__ import annotations

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
    assert model.embedding.embedding.dtype.name == dtype
    impl_tf.save_weights(model, tmp_path / "out.safetensors")
    c2, back = load_weights(tmp_path / "out.safetensors")
    assert c2 == c and sorted(back) == sorted(params)
    for name, a in params.items():
        assert back[name].dtype == a.dtype and back[name].tobytes() == a.tobytes(), name


def test_wrong_shape_is_named(config, tmp_path):
    params = init_params(config, 0)
    params["decoder.layers.0.ffn.w_1"] = np.zeros((3, 3), params["embedding"].dtype)
    with pytest.raises(ValueError, match=r"parameter 'decoder\.layers\.0\.ffn\.w_1': expected shape"):
        impl_tf.Transformer(config, params)


def test_truncated_file_is_named(config, tmp_path):
    save_weights(tmp_path / "ok.safetensors", config, init_params(config, 0))
    data = (tmp_path / "ok.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cut\.safetensors"):
        impl_tf.load_weights(tmp_path / "cut.safetensors")
