"""Greedy and beam search: output form, batching, pad and BOS never generated, argument checks, evaluation mode, and
agreement with spec.search on a float32 model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import impl_torch
from impl_torch.search import stable_topk
from spec import reference as ref
from spec import search
from spec.config import TINY
from spec.golden_cases import EOS_BOOST, make_params
from spec.numerics import Numerics

C32 = TINY.replace(dtype="float32", param_dtype="float32")


@pytest.fixture(scope="module")
def model32():
    return impl_torch.from_params(C32, make_params(C32, 101, EOS_BOOST))


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_same_tokens_as_spec_search(kind, model32, ids):
    """The float32 model's decisions match the reference's (spec.search) on these inputs."""
    src = ids(20, 3, 6)
    src[1, 4:] = C32.pad_id
    P = ref.as_float64(impl_torch.params_of(model32), C32)
    if kind == "greedy":
        want = search.greedy_search(P, src.numpy(), C32, Numerics("float32"), max_new_tokens=12)
        got = impl_torch.greedy_search(model32, src, max_new_tokens=12)
    else:
        want = search.beam_search(P, src.numpy(), C32, Numerics("float32"), max_new_tokens=12)
        got = impl_torch.beam_search(model32, src, max_new_tokens=12)
    np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_each_row_decodes_as_if_alone(kind, model32, ids):
    src = ids(21, 3, 7)
    src[2, 3:] = C32.pad_id
    run = impl_torch.greedy_search if kind == "greedy" else impl_torch.beam_search
    batch = run(model32, src)
    for b in range(3):
        alone = run(model32, src[b:b + 1])[0]
        np.testing.assert_array_equal(batch[b, :len(alone)].numpy(), alone.numpy())
        assert (batch[b, len(alone):] == C32.pad_id).all()


def test_output_stops_at_eos_or_the_limit(model32, ids):
    src = ids(22, 4, 5)
    for out in (impl_torch.greedy_search(model32, src), impl_torch.beam_search(model32, src, beam_size=3)):
        assert out.dtype == torch.long and out.shape[0] == 4 and out.shape[1] <= 5 + 50
        for row in out:
            eos = (row == C32.eos_id).nonzero()
            end = int(eos[0]) + 1 if len(eos) else len(row)
            assert (row[end:] == C32.pad_id).all()


def _favouring_special_tokens(seed: int) -> tuple[impl_torch.Transformer, dict]:
    """A float32 model whose unrestricted argmax is pad (then BOS): the last LayerNorm's bias gets a large
    component along u, and E[pad], E[bos] point along u (as the conformance check builds it)."""
    params = make_params(C32, seed, EOS_BOOST)
    u = np.random.default_rng(0).standard_normal(C32.d_model).astype(np.float32)
    u /= np.linalg.norm(u)
    params[f"decoder.layers.{C32.n_decoder_layers - 1}.ffn_norm.bias"] += 8.0 * u
    params["embedding"][C32.pad_id], params["embedding"][C32.bos_id] = 3.0 * u, 2.5 * u
    return impl_torch.from_params(C32, params), params


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_pad_and_bos_never_generated(kind, ids):
    """Forbidden as spec.search does: greedy on the logits, beam after the full-vocabulary log-softmax (forbidding
    them before it changes this beam's tokens)."""
    model, params = _favouring_special_tokens(101)
    src = ids(20, 3, 6)
    src[1, 4:] = C32.pad_id
    with torch.no_grad():
        first = model(src, torch.full((3, 1), C32.bos_id))[:, 0]                  # (B, V)
    assert (first.argmax(-1) == C32.pad_id).all()
    P, nx = ref.as_float64(params, C32), Numerics("float32")
    if kind == "greedy":
        want = search.greedy_search(P, src.numpy(), C32, nx, max_new_tokens=12)
        got = impl_torch.greedy_search(model, src, max_new_tokens=12)
    else:
        want = search.beam_search(P, src.numpy(), C32, nx, 3, 0.6, max_new_tokens=12)
        got = impl_torch.beam_search(model, src, 3, 0.6, max_new_tokens=12)
    np.testing.assert_array_equal(got.numpy(), want)
    for row in got:
        end = int((row == C32.eos_id).nonzero()[0]) if (row == C32.eos_id).any() else len(row)
        assert not torch.isin(row[:end], torch.tensor([C32.pad_id, C32.bos_id])).any()


def test_numpy_scalar_arguments_and_negative_stride_ids(model32, ids):
    """NumPy integers and floats give what the Python ones give; a reversed view's ids what a contiguous copy's do."""
    src = ids(24, 2, 5).numpy()[::-1]
    assert src.strides[0] < 0
    np.testing.assert_array_equal(impl_torch.greedy_search(model32, src, np.int64(5)),
                                  impl_torch.greedy_search(model32, src.copy(), 5))
    np.testing.assert_array_equal(impl_torch.beam_search(model32, src, np.int32(2), np.float32(0.5), np.int64(5)),
                                  impl_torch.beam_search(model32, src.copy(), 2, float(np.float32(0.5)), 5))


@pytest.mark.parametrize("kwargs, pattern", [
    ({"max_new_tokens": 0}, "max_new_tokens must be a positive int"),
    ({"max_new_tokens": True}, "max_new_tokens must be a positive int"),
    ({"max_new_tokens": np.float64(5)}, "max_new_tokens must be a positive int"),
    ({"max_new_tokens": 100}, "generation may need 100 target positions but max_len is 64"),
    ({"beam_size": 0}, "beam_size must be a positive int"),
    ({"beam_size": 2.0}, "beam_size must be a positive int"),
    ({"alpha": float("nan")}, "alpha must be a finite float >= 0"),
    ({"alpha": True}, "alpha must be a finite float >= 0"),
    ({"alpha": 1e6}, r"alpha=1000000.0 makes the length penalty .* overflow float32"),
])
def test_bad_generation_arguments(kwargs, pattern, ids):
    """The spec's messages (spec.validate), beam arguments checked against the generation limits."""
    m = impl_torch.from_params(C32, make_params(C32, 1))
    src = ids(23, 1, 4)
    with pytest.raises(ValueError, match=pattern):
        impl_torch.beam_search(m, src, **kwargs)
    if "max_new_tokens" in kwargs:
        with pytest.raises(ValueError, match=pattern):
            impl_torch.greedy_search(m, src, **kwargs)


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_search_computes_in_eval_mode_and_restores_the_mode(kind, ids):
    """A new model (training mode, dropout 0.1) decodes without dropout: the same tokens twice, and those of the
    model in eval mode; every submodule's mode is as before afterwards, a mixed one included."""
    run = impl_torch.greedy_search if kind == "greedy" else impl_torch.beam_search
    model = impl_torch.Transformer(C32.replace(dropout=0.1), seed=2)
    src = ids(25, 2, 6)
    first, second = run(model, src, max_new_tokens=10), run(model, src, max_new_tokens=10)
    assert model.training and all(m.training for m in model.modules())
    np.testing.assert_array_equal(first.numpy(), second.numpy())
    model.decoder.eval()
    modes = [m.training for m in model.modules()]
    np.testing.assert_array_equal(run(model, src, max_new_tokens=10).numpy(), first.numpy())
    assert [m.training for m in model.modules()] == modes
    model.eval()
    np.testing.assert_array_equal(run(model, src, max_new_tokens=10).numpy(), first.numpy())
    assert not any(m.training for m in model.modules())


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_mode_restored_after_an_error(kind, ids):
    run = impl_torch.greedy_search if kind == "greedy" else impl_torch.beam_search
    model = impl_torch.Transformer(C32)
    with pytest.raises(ValueError, match="max_new_tokens must be a positive int"):
        run(model, ids(26, 1, 4), max_new_tokens=0)
    assert model.training


@pytest.mark.parametrize("seed", range(6))
def test_top_candidates_are_a_stable_sorts_first(seed):
    # beam search's top 2k: equal values in index order, ties across the cut too (coarse values force them)
    rng = np.random.default_rng(seed)
    cand = np.round(rng.normal(size=(5, 40)), 0 if seed % 2 else 3).astype(np.float32)
    if seed > 3:
        cand[0, 30:] = cand[1, 5:] = -np.inf                                  # -inf ties: fewer finite than n
    for n in (1, 8, 39, 40):
        expected = np.argsort(-cand, axis=-1, kind="stable")[:, :n]
        np.testing.assert_array_equal(stable_topk(torch.from_numpy(cand), n).numpy(), expected)
