"""Weights: canonical names <-> the model (its key paths), the spec's checks on save and load."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import impl_jax
from impl_jax import layers
from spec.config import BASE, TINY
from spec.init import init_params
from spec.schema import param_specs


def test_params_of_is_canonical_in_schema_order_and_stored_dtype():
    c = TINY.replace(dtype="float32")                       # bf16 parameters, float32 activations
    params = impl_jax.params_of(impl_jax.Transformer(c, 0))
    assert list(params) == [s.name for s in param_specs(c)]
    assert all(type(a) is np.ndarray and a.dtype == ml_dtypes.bfloat16 for a in params.values())


def test_load_with_a_config_that_differs_where_the_weights_do_not_depend_on_it(tmp_path):
    impl_jax.save_weights(impl_jax.Transformer(TINY, 0), tmp_path / "a.safetensors")
    with pytest.warns(UserWarning, match="max_len 64 -> 32"):
        m = impl_jax.load_weights(tmp_path / "a.safetensors", TINY.replace(max_len=32))
    assert m.config == TINY.replace(max_len=32)
    with pytest.raises(ValueError, match="the weights depend on d_ff"):
        impl_jax.load_weights(tmp_path / "a.safetensors", TINY.replace(d_ff=64))


def test_from_params_checks_the_params_against_the_config():
    """Tiny parameters with the base config: the spec's error, not a shape error deep in XLA."""
    with pytest.raises(ValueError, match=r"missing parameter 'encoder\.layers\.2\.self_attn\.w_q'"):
        impl_jax.from_params(BASE, init_params(TINY, 0))
    two_layers = BASE.replace(n_encoder_layers=2, n_decoder_layers=2)
    with pytest.raises(ValueError, match=r"parameter 'embedding': expected shape \(37000, 512\), got \(61, 32\)"):
        impl_jax.from_params(two_layers, init_params(TINY, 0))
    flat = init_params(TINY, 0)
    flat["decoder.final_norm.scale"] = np.ones(TINY.d_model, flat["embedding"].dtype)
    with pytest.raises(ValueError, match=r"unexpected parameter 'decoder\.final_norm\.scale'"):
        impl_jax.from_params(TINY, flat)


def test_the_model_is_a_tree_of_modules_keyed_by_canonical_names():
    m = impl_jax.Transformer(TINY, 0)
    assert isinstance(m.decoder.layers[1].cross_attn, layers.MultiHeadAttention) and len(m.encoder.layers) == 2
    w = m.decoder.layers[1].cross_attn.w_o
    assert w.shape == (TINY.n_heads, TINY.d_v, TINY.d_model) and w.dtype == jnp.bfloat16
    paths = [jax.tree_util.keystr(p, simple=True, separator=".") for p, _ in jax.tree_util.tree_leaves_with_path(m)]
    assert paths == ["embedder.table", *list(init_params(TINY, 0))[1:]]


def test_save_checks_against_the_schema(tmp_path):
    m = impl_jax.Transformer(TINY, 0)
    m = jax.tree_util.tree_map_with_path(lambda p, x: x[:-1] if jax.tree_util.keystr(p).endswith("ffn.b_2") else x, m)
    with pytest.raises(ValueError, match=r"parameter 'encoder\.layers\.0\.ffn\.b_2': expected shape"):
        impl_jax.save_weights(m, tmp_path / "bad.safetensors")
    assert not (tmp_path / "bad.safetensors").exists()
