"""Dropout (section 5.4) in impl_torch: the mask's statistics and scale, its sites, evaluation without it, and the
masks drawn from the train state's generator alone, never from torch's global RNG."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import impl_torch as T
import spec
from spec import demo, training
from spec.recording import recording

FP32 = spec.preset("tiny", dtype="float32", param_dtype="float32")
MIXED = spec.preset("tiny", dtype="bfloat16", param_dtype="float32")
# Three reverse-task rows of 3 to 6 tokens (``spec.demo``): src (B, S), tgt_in and tgt_out (B, T), padded rows.
SRC, TGT_IN, TGT_OUT = demo.reverse_batch(np.random.default_rng(0), FP32, 3, min_len=3, max_len=6)
WARMUP10 = training.TrainConfig(warmup_steps=10)                       # large, visible steps


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_keeps_one_minus_rate_and_scales_by_its_inverse(dtype):
    """Kept fraction within 5 standard deviations of 1 - rate; kept values the fp32 quotient by the fp32 divisor
    (NumPy's, correctly rounded), rounded once; the mask and the result recorded under the site's name."""
    rate, n = 0.1, 200_000
    x = torch.linspace(0.5, 2.0, n).to(dtype)                           # (n,)
    with recording() as rec:
        y = T.layers.dropout(x, "site", rate, torch.Generator().manual_seed(0))
    kept = y != 0
    assert rec["site"] is y and rec["site.keep"].dtype == torch.bool and torch.equal(rec["site.keep"], kept)
    sigma = np.sqrt(rate * (1 - rate) / n)
    assert abs(kept.float().mean().item() - (1 - rate)) <= 5 * sigma
    want = torch.from_numpy(x[kept].float().numpy() / np.float32(1 - rate)).to(dtype)
    torch.testing.assert_close(y[kept], want, rtol=0, atol=0)
    with recording() as rec:
        assert T.layers.dropout(x, "site", rate, None) is x             # evaluation: the identity
    assert list(rec) == ["site"]


class _MaskCensus(TorchDispatchMode):
    """Counts the dropout masks (``aten.bernoulli_``) drawn inside it."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in (torch.ops.aten.bernoulli_.float, torch.ops.aten.bernoulli_.Tensor)
        return func(*args, **(kwargs or {}))


def test_dropout_sits_on_both_embeddings_and_every_sublayer():
    c = spec.preset("tiny")
    with _MaskCensus() as census:
        T.Transformer(c, seed=0)(SRC, TGT_IN, rng=torch.Generator().manual_seed(0))
    assert census.count == 2 + 2 * c.n_encoder_layers + 3 * c.n_decoder_layers


def test_evaluation_leaves_the_mode():
    """A training-mode model with dropout 0.5: ``loss_and_gradients`` and greedy search leave every module in
    training mode, and its forward without a generator is evaluation in either mode (that evaluation never drops
    out is the conformance suite's ``test_api_evaluation_never_drops_out``)."""
    heavy = T.Transformer(FP32.replace(dropout=0.5), seed=0)                 # training mode
    T.loss_and_gradients(heavy, SRC, TGT_IN, TGT_OUT)
    T.greedy_search(heavy, SRC)
    assert heavy.training and all(m.training for m in heavy.modules())
    with torch.no_grad():
        training = heavy(SRC, TGT_IN)
        torch.testing.assert_close(heavy.eval()(SRC, TGT_IN), training, rtol=0, atol=0)


def _one_step(state_seed: int, global_seed: int) -> tuple[float, dict[str, np.ndarray]]:
    torch.manual_seed(global_seed)                                       # must not matter
    model = T.Transformer(MIXED, seed=0)
    loss, model, _ = T.train_step(model, T.init_train_state(model, WARMUP10, seed=state_seed), SRC, TGT_IN, TGT_OUT)
    return float(loss), T.params_of(model)


def test_dropout_masks_come_from_the_state_seed_alone():
    loss, params = _one_step(0, global_seed=1)
    loss_again, params_again = _one_step(0, global_seed=2)
    loss_other, params_other = _one_step(1, global_seed=1)
    assert loss == loss_again and all((params[k] == params_again[k]).all() for k in params)
    assert loss != loss_other and any((params[k] != params_other[k]).any() for k in params)
    c = MIXED.replace(dropout=0.0)                                       # the dropout changed the loss
    assert loss != float(T.loss_and_gradients(T.Transformer(c, seed=0), SRC, TGT_IN, TGT_OUT)[0])
