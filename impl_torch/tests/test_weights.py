"""Weights I/O: a bit-exact round trip, canonical params, the config rule, and the spec's errors."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import impl_torch
from spec import TINY, init_params, save_weights
from spec.golden_cases import make_params
from spec.schema import param_specs


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


@pytest.mark.parametrize("param_dtype", ["bfloat16", "float32"])
def test_from_params_and_params_of_are_canonical(param_dtype):
    """from_params holds the arrays bit for bit, in eval mode; params_of gives schema names and order, the stored
    dtype (bf16 as ml_dtypes.bfloat16)."""
    c = TINY.replace(param_dtype=param_dtype)
    params = init_params(c, 7, observable=True)
    model = impl_torch.from_params(c, params)
    assert not model.training and model.config == c
    back = impl_torch.params_of(model)
    assert list(back) == [s.name for s in param_specs(c)]
    want = ml_dtypes.bfloat16 if param_dtype == "bfloat16" else np.float32
    assert all(isinstance(a, np.ndarray) and a.dtype == want for a in back.values())
    assert all(back[n].tobytes() == a.tobytes() for n, a in params.items())


def test_load_weights_takes_a_config_the_weights_fit(tmp_path):
    """The config rule of spec.weights_io: a config differing where the weights do not depend on it is used
    (with a warning); one differing where they do is refused, naming the field."""
    save_weights(tmp_path / "w.safetensors", TINY, make_params(TINY, 3))
    with pytest.warns(UserWarning, match="dropout 0.1 -> 0.0"):
        model = impl_torch.load_weights(tmp_path / "w.safetensors", TINY.replace(dropout=0.0))
    assert model.config == TINY.replace(dropout=0.0)
    with pytest.raises(ValueError, match="d_ff"):
        impl_torch.load_weights(tmp_path / "w.safetensors", TINY.replace(d_ff=64))
