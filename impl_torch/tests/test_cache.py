"""The encoder-decoder model's KV cache: spec.api's fields and layouts, buffers written in place by decode, a consumed
cache refused, its capacity checked."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import spec.api
from spec import TINY


def test_kv_cache_fields_and_layouts(ids, tiny):
    """The fields of spec.api in its order and layouts; decode writes the cache's buffers in place and returns a
    new cache over them."""
    m, c = tiny(), TINY
    B, S, P = 3, 5, 7
    src = ids(40, B, S)
    src[1, 3:] = c.pad_id
    cache = m.init_cache(m.encode(src), src, capacity=P)
    assert tuple(f.name for f in dataclasses.fields(cache)) == spec.api.KV_CACHE_FIELDS
    assert len(cache.self_kv) == len(cache.memory_kv) == c.n_decoder_layers
    for (k, v), (mk, mv) in zip(cache.self_kv, cache.memory_kv, strict=True):
        assert k.shape == (B, c.n_heads, P, c.d_k) and v.shape == (B, c.n_heads, P, c.d_v)   # heads-major
        assert mk.shape == (B, c.n_heads, S, c.d_k) and mv.shape == (B, c.n_heads, S, c.d_v)
    assert cache.key_mask.shape == (B, P) and cache.key_mask.dtype == torch.bool and not cache.key_mask.any()
    assert cache.memory_mask.dtype == torch.bool
    torch.testing.assert_close(cache.memory_mask, src != c.pad_id, rtol=0, atol=0)
    assert cache.length == 0 and cache.key_mask.shape[1] == P
    tokens = torch.tensor([[1, 5], [1, c.pad_id], [1, 9]])
    logits, returned = m.decode(tokens, cache)
    assert returned is not cache and returned.length == 2 and logits.shape == (B, 2, c.vocab_size)
    assert returned.self_kv[0][0] is cache.self_kv[0][0]                       # the same buffers, written in place
    torch.testing.assert_close(returned.key_mask[:, :2], tokens != c.pad_id, rtol=0, atol=0)
    assert not returned.key_mask[:, 2:].any()


def test_a_consumed_cache_is_refused(ids, tiny):
    """decode writes the buffers in place, so decoding from the cache it was given again would read positions it
    has already written: it raises instead of returning wrong logits (jax and tf return the same logits again)."""
    m = tiny()
    src = ids(41, 2, 5)
    cache = m.init_cache(m.encode(src), src, capacity=4)
    first, after = m.decode([[1], [1]], cache)
    with pytest.raises(ValueError, match="cache: consumed by an earlier decode"):
        m.decode([[1], [1]], cache)
    again, _ = m.decode([[7], [7]], after)                                    # the returned cache goes on
    assert again.shape == first.shape


def test_cache_has_no_room_for_more(ids, tiny):
    m = tiny()
    src = ids(10, 1, 4)
    cache = m.init_cache(m.encode(src), src, capacity=2)
    _, cache = m.decode(torch.tensor([[1, 5]]), cache)
    with pytest.raises(ValueError, match="exceed the cache capacity 2"):
        m.decode(torch.tensor([[5]]), cache)


@pytest.mark.parametrize("capacity", [2.5, True, 0, 65, np.float64(4)])
def test_cache_capacity_is_an_int_in_1_to_max_len(capacity, ids, tiny):
    m = tiny()
    src = ids(17, 1, 4)
    with pytest.raises(ValueError, match=r"capacity must be an int in \[1, max_len=64\], got "):
        m.init_cache(m.encode(src), src, capacity)
