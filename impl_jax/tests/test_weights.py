"""Weights: pytree <-> canonical names, a bit-exact file round trip, the spec's errors."""

from __future__ import annotations

import pytest

import impl_jax
from spec.config import TINY
from spec.init import init_params
from spec.weights_io import load_weights


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_round_trip_is_bit_exact(dtype, tmp_path):
    c = TINY.replace(dtype=dtype, param_dtype=dtype, norm_first=True)
    flat = init_params(c, 5, observable=True)
    params = impl_jax.to_tree(flat)
    impl_jax.save_weights(params, c, tmp_path / "a.safetensors")
    c2, back = impl_jax.load_weights(tmp_path / "a.safetensors")
    assert c2 == c
    for name, a in load_weights(tmp_path / "a.safetensors")[1].items():
        assert a.dtype == flat[name].dtype and a.tobytes() == flat[name].tobytes(), name
    assert {k: v.tobytes() for k, v in impl_jax.to_flat(back).items()} == {k: v.tobytes() for k, v in flat.items()}


def test_tree_layout_and_params_at():
    params = impl_jax.to_tree(init_params(TINY, 0))
    assert isinstance(params["encoder"]["layers"], list) and len(params["decoder"]["layers"]) == TINY.n_decoder_layers
    w = impl_jax.params_at(params, "decoder.layers.1.cross_attn")["w_o"]
    assert w.shape == (TINY.n_heads, TINY.d_v, TINY.d_model)
    assert impl_jax.params_at(params, "") is params


def test_save_checks_against_the_schema(tmp_path):
    params = impl_jax.to_tree(init_params(TINY, 0))
    del params["decoder"]["layers"][1]["ffn"]["b_2"]
    with pytest.raises(ValueError, match=r"missing parameter 'decoder\.layers\.1\.ffn\.b_2'"):
        impl_jax.save_weights(params, TINY, tmp_path / "bad.safetensors")
    assert not (tmp_path / "bad.safetensors").exists()


def test_corrupt_file_is_named(tmp_path):
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="junk.safetensors"):
        impl_jax.load_weights(tmp_path / "junk.safetensors")
