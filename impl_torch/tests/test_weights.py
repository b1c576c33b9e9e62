"""Weights I/O: a bit-exact round trip, and the spec's errors."""

from __future__ import annotations

import numpy as np
import pytest

import impl_torch
from spec import TINY, save_weights
from spec.golden_cases import make_params


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_round_trip_bit_exact(dtype, tmp_path):
    c = TINY.replace(dtype=dtype, param_dtype=dtype)
    params = make_params(c, 3)
    save_weights(tmp_path / "a.safetensors", c, params)
    model = impl_torch.load_weights(tmp_path / "a.safetensors")
    assert not model.training
    impl_torch.save_weights(model, tmp_path / "b.safetensors")
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    back = impl_torch.params_of(model)
    assert all(back[n].dtype == a.dtype and back[n].tobytes() == a.tobytes() for n, a in params.items())


def test_errors_name_the_tensor_and_the_file(tmp_path):
    params = make_params(TINY, 3)
    params["decoder.layers.0.ffn.b_1"] = params["decoder.layers.0.ffn.b_1"][:-1]
    with pytest.raises(ValueError, match=r"parameter 'decoder\.layers\.0\.ffn\.b_1': expected shape"):
        impl_torch.from_params(TINY, params)
    save_weights(tmp_path / "ok.safetensors", TINY, make_params(TINY, 3))
    data = (tmp_path / "ok.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:len(data) // 3])
    with pytest.raises(ValueError, match=r"cut\.safetensors"):
        impl_torch.load_weights(tmp_path / "cut.safetensors")


def test_to_array_and_to_tensor_keep_bits():
    a = make_params(TINY, 4)["embedding"]
    assert np.array_equal(impl_torch.to_array(impl_torch.to_tensor(a)).view(np.uint16), a.view(np.uint16))
