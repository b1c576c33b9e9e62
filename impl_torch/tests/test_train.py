"""Training (spec.training, sections 5.3 and 5.4): gradients against spec.backward's float64 VJPs, Adam against
spec.training.adam_update, the checkpoint options' parameters, learning, bad input, and no global state touched
(dropout: test_dropout.py; the train-state file: test_train_state.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import impl_torch as T
import spec
from spec import backward, training
from spec.numerics import EPS
from spec.schema import param_specs

SRC = np.array([[5, 9, 17, 2, 0, 0], [7, 8, 9, 10, 11, 2]])           # (B, S), row 0 padded
TGT_IN = np.array([[1, 4, 5, 6, 0], [1, 7, 8, 9, 10]])                # (B, T)
TGT_OUT = np.array([[4, 5, 6, 2, 0], [7, 8, 9, 10, 2]])               # (B, T), one padding target
FP32 = spec.preset("tiny", dtype="float32", param_dtype="float32")
MIXED = spec.preset("tiny", dtype="bfloat16", param_dtype="float32")
WARMUP10 = training.TrainConfig(warmup_steps=10)                       # large, visible steps
OPTIONS = MIXED.replace(activation="silu", attention_bias=True, logits_bias=True, positions="learned",
                        scale_embedding=False)                          # every checkpoint option off the paper's


def _errors(got: torch.Tensor, want: np.ndarray, eps: float) -> tuple[float, float]:
    """(max, RMS) of got - want in ulps of ``eps`` at the scale of want's RMS."""
    err, scale = got.numpy().astype(np.float64) - want, np.sqrt((want ** 2).mean())
    return np.abs(err).max() / scale / eps, np.sqrt((err ** 2).mean()) / scale / eps


def _params64(model) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, np.float64) for k, v in T.params_of(model).items()}


# ----------------------------------------------------------------- gradients

def test_fp32_gradients_match_the_float64_backward():
    """Measured: loss 0.63 ulps off; gradients at most 41 ulps max (encoder.layers.1.self_attn.w_q) and 6.1 ulps
    RMS (decoder.layers.1.self_attn.w_q) at each tensor's RMS. That is fp32 rounding noise, not a defect: merely
    reversing the batch's row order changes the same torch gradient by up to 54 ulps (q and k projections get their
    gradient through the softmax Jacobian, a difference of nearly equal terms). Bounds: 128 ulps max, 16 RMS (a
    wrong gradient is off by ~1e7 ulps)."""
    c = FP32.replace(dropout=0.0)
    model = T.Transformer(c, seed=0)
    loss, grads = T.loss_and_gradients(model, SRC, TGT_IN, TGT_OUT, label_smoothing=0.1)
    loss64, grads64 = backward.loss_and_gradients(T.params_of(model), SRC, TGT_IN, TGT_OUT, c, 0.1)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert float(loss) == pytest.approx(loss64, rel=4 * EPS["float32"])
    assert list(grads) == [s.name for s in param_specs(c)]
    for name, want in grads64.items():
        assert grads[name].dtype == torch.float32 and grads[name].shape == want.shape, name
        max_err, rms_err = _errors(grads[name], want, EPS["float32"])
        assert max_err <= 128 and rms_err <= 16, (name, max_err, rms_err)


def test_mixed_gradients_are_the_fp32_masters_gradients():
    """bf16 compute with fp32 parameters against spec.backward at the bf16-rounded weights (rule 0). Measured in
    bf16 ulps at each tensor's RMS: at most 25.6 max (encoder.layers.1.self_attn.w_q) and 2.0 RMS, the forward's
    bf16 roundings and the bf16 activation gradients carried back; loss 2.3e-4 relative. Bounds: 64 max, 4 RMS,
    loss 2^-9 relative. A pure-bf16 model of the same (rounded) weights gives the very same fp32 gradients."""
    c = MIXED.replace(dropout=0.0)
    model = T.Transformer(c, seed=0)
    loss, grads = T.loss_and_gradients(model, SRC, TGT_IN, TGT_OUT)
    loss64, grads64 = backward.loss_and_gradients(T.params_of(model), SRC, TGT_IN, TGT_OUT, c, 0.1)
    assert float(loss) == pytest.approx(loss64, rel=2.0 ** -9)
    for name, want in grads64.items():
        g = grads[name]
        assert g.dtype == torch.float32 and g.shape == want.shape and bool(g.isfinite().all()), name
        max_err, rms_err = _errors(g, want, EPS["bfloat16"])
        assert max_err <= 64 and rms_err <= 4, (name, max_err, rms_err)
    bf16 = c.replace(param_dtype="bfloat16")
    rounded = {k: spec.reference.as_float64(T.params_of(model), c)[k].astype(spec.numerics.BF16) for k in grads}
    loss_bf16, grads_bf16 = T.loss_and_gradients(T.from_params(bf16, rounded), SRC, TGT_IN, TGT_OUT)
    assert float(loss_bf16) == float(loss)
    for name, g in grads.items():
        torch.testing.assert_close(grads_bf16[name], g, rtol=0, atol=0)


class _GemmCensus(TorchDispatchMode):
    """Counts the 2-D GEMMs (``aten.mm``, ``aten.addmm``) run inside it, by operand dtype."""

    def __init__(self):
        super().__init__()
        self.counts: dict[torch.dtype, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            dtype = args[-1].dtype                                       # mat2's: both operands share it
            self.counts[dtype] = self.counts.get(dtype, 0) + 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("native", [True, False], ids=["native_bf16_gemm", "fp32_gemm"])
def test_mixed_training_runs_parameter_products_as_native_bf16_gemms(native):
    """With ``native_bf16``, mixed-precision training runs each parameter product's forward and dx as bf16 GEMMs
    and only dW as an fp32 one (``numerics._NativeLinear``); without, all as fp32 GEMMs. The tied output
    projection's three products stay fp32 (rule 7: fp32 logits, fp32 d logits)."""
    c = MIXED.replace(dropout=0.0)
    n = 6 * c.n_encoder_layers + 10 * c.n_decoder_layers           # q, k, v, o (twice in a decoder), W_1, W_2
    model = T.Transformer(c, seed=0, native_bf16=native)
    with _GemmCensus() as census:
        T.loss_and_gradients(model, SRC, TGT_IN, TGT_OUT)
    if native:
        assert census.counts == {torch.bfloat16: 2 * n, torch.float32: n + 3}
    else:
        assert census.counts == {torch.float32: 3 * n + 3}


# ----------------------------------------------------------------- Adam

def test_train_steps_match_adam_on_the_float64_gradient():
    """Three fp32 steps against spec.training.adam_update on spec.backward's gradients, both from the same weights.
    Measured: losses within 0.7 fp32 ulps; parameters within 1.2e-5 lr(1) after step 1 and 6.4e-5 lr(3) after step 3
    (Adam divides by |g|: small gradient entries carry their fp32 noise into the step); moments at most 61 ulps
    max at m's RMS, 185 at v's (v = g^2 doubles g's relative error and has heavier tails). Bounds: loss 8 ulps,
    parameters 1e-3 lr, m 128 ulps (the gradients' bound), v 512."""
    c = FP32.replace(dropout=0.0)
    model = T.Transformer(c, seed=0)
    state = T.init_train_state(model, WARMUP10)
    params, adam = _params64(model), training.adam_init(_params64(model))
    for t in (1, 2, 3):
        loss64, grads64 = backward.loss_and_gradients(params, SRC, TGT_IN, TGT_OUT, c, 0.1)
        params, adam = training.adam_update(params, grads64, adam, c.d_model, WARMUP10)
        loss, model_out, state_out = T.train_step(model, state, SRC, TGT_IN, TGT_OUT)
        assert model_out is model and state_out is state and state.step == t
        assert loss.dtype == torch.float32 and float(loss) == pytest.approx(loss64, rel=8 * EPS["float32"])
        lr = training.learning_rate(t, c.d_model, WARMUP10.warmup_steps)
        got = T.params_of(model)
        for name, want in params.items():
            assert np.abs(got[name] - want).max() <= 1e-3 * lr, (t, name)
        for name in params:
            assert _errors(state.m[name], adam.m[name], EPS["float32"])[0] <= 128, (t, name)
            assert _errors(state.v[name], adam.v[name], EPS["float32"])[0] <= 512, (t, name)


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_updates_keep_param_dtype_and_fp32_moments(param_dtype):
    model = T.Transformer(MIXED.replace(param_dtype=param_dtype), seed=0)
    state = T.init_train_state(model, WARMUP10)
    before = {k: a.copy() for k, a in T.params_of(model).items()}     # params_of's arrays share the tensors' memory
    T.train_step(model, state, SRC, TGT_IN, TGT_OUT)
    after = T.params_of(model)
    assert all(after[k].dtype == before[k].dtype for k in before)
    assert any((after[k] != before[k]).any() for k in before)                # the step is visible in bf16 too
    assert all(m.dtype == v.dtype == torch.float32 for m, v in zip(state.m.values(), state.v.values(), strict=True))


@pytest.mark.parametrize("native", [False, True], ids=["fp32_gemm", "native_bf16_gemm"])
def test_the_checkpoint_options_parameters_train(native):
    """The parameters of spec.config's options get fp32 gradients, in schema order, and a step moves each: every
    attention bias but b_k, whose exact gradient is 0 (softmax ignores a constant added to a query's scores)."""
    model = T.Transformer(OPTIONS, seed=0, native_bf16=native)
    before = {k: a.copy() for k, a in T.params_of(model).items()}     # params_of's arrays share the tensors' memory
    loss, grads = T.loss_and_gradients(model, SRC, TGT_IN, TGT_OUT)
    assert list(grads) == list(before) == [s.name for s in param_specs(OPTIONS)]
    assert all(g.dtype == torch.float32 and bool(g.isfinite().all()) for g in grads.values())
    T.train_step(model, T.init_train_state(model, WARMUP10), SRC, TGT_IN, TGT_OUT)
    after = T.params_of(model)
    assert [k for k in before if (after[k] == before[k]).all() and not k.endswith(".b_k")] == []


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_forward_after_a_step_reads_the_updated_weights(param_dtype):
    """A step in place is seen by the next forward: no stale copy of a parameter is read."""
    model = T.Transformer(MIXED.replace(param_dtype=param_dtype), seed=0).eval()
    with torch.inference_mode():
        before = model(SRC, TGT_IN)                                      # fills the fp32 copies
    T.train_step(model, T.init_train_state(model, WARMUP10), SRC, TGT_IN, TGT_OUT)
    fresh = T.from_params(model.config, T.params_of(model))
    with torch.inference_mode():
        after, want = model(SRC, TGT_IN), fresh(SRC, TGT_IN)
    torch.testing.assert_close(after, want, rtol=0, atol=0)
    assert not torch.equal(after, before)


def test_train_step_restores_every_submodule_mode():
    model = T.Transformer(MIXED, seed=0)
    model.encoder.eval()                                                 # a mixed set of modes
    modes = [m.training for m in model.modules()]
    T.train_step(model, T.init_train_state(model), SRC, TGT_IN, TGT_OUT)
    assert [m.training for m in model.modules()] == modes


def test_library_changes_no_global_state(tmp_path):
    rng, grad = torch.random.get_rng_state(), torch.is_grad_enabled()
    model = T.Transformer(MIXED, seed=0)
    state = T.init_train_state(model, seed=3)
    T.train_step(model, state, SRC, TGT_IN, TGT_OUT)
    T.save_train_state(state, tmp_path / "s.safetensors")
    T.load_train_state(tmp_path / "s.safetensors", model)
    T.loss_and_gradients(model, SRC, TGT_IN, TGT_OUT)
    assert torch.equal(torch.random.get_rng_state(), rng) and torch.is_grad_enabled() == grad


# ----------------------------------------------------------------- learning

def test_a_copy_task_is_learned():
    """4 sequences to copy, 60 steps of mixed precision with dropout 0.1: measured 4.33 -> 1.38."""
    rng = np.random.default_rng(0)
    src = np.concatenate([rng.integers(3, 61, (4, 7)), np.full((4, 1), 2)], axis=1)     # (4, 8), EOS last
    tgt_in = np.concatenate([np.ones((4, 1), int), src[:, :-1]], axis=1)                # (4, 8), BOS first
    model = T.Transformer(MIXED, seed=0)
    state = T.init_train_state(model, training.TrainConfig(warmup_steps=20))
    losses = [float(T.train_step(model, state, src, tgt_in, src)[0]) for _ in range(60)]
    assert losses[-1] < 0.5 * losses[0], losses


# ----------------------------------------------------------------- bad input

@pytest.mark.parametrize("args, match", [
    ((SRC, TGT_IN, TGT_OUT[:, :3]), r"tgt_out: shape \(2, 3\) differs from tgt_in's \(2, 5\)"),
    ((SRC, TGT_IN, np.zeros_like(TGT_OUT)), "every target is pad_id"),
    ((SRC, TGT_IN, TGT_OUT + 60), "tgt_out: token id"),
    ((SRC, TGT_IN, TGT_OUT.astype(float)), "tgt_out: token ids must be integers"),
    ((SRC[:1], TGT_IN, TGT_OUT), "batch sizes differ"),
    ((np.zeros_like(SRC), TGT_IN, TGT_OUT), "src: sequence 0 is all padding"),
])
def test_bad_batches_raise_before_computing(args, match):
    model = T.Transformer(MIXED, seed=0)
    state, before = T.init_train_state(model), {k: a.copy() for k, a in T.params_of(model).items()}
    with pytest.raises(ValueError, match=match):
        T.train_step(model, state, *args)
    with pytest.raises(ValueError, match=match):
        T.loss_and_gradients(model, *args)
    assert state.step == 0 and all((T.params_of(model)[k] == before[k]).all() for k in before)


@pytest.mark.parametrize("seed", [-1, 1.0, True, "0"])
def test_bad_seeds_are_rejected(seed):
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        T.init_train_state(T.Transformer(MIXED, seed=0), seed=seed)


def test_train_state_fields():
    model = T.Transformer(MIXED, seed=0)
    state = T.init_train_state(model)
    assert [f.name for f in dataclasses.fields(state)] == ["step", "train_config", "m", "v", "rng"]
    assert state.step == 0 and state.train_config == training.TrainConfig() and isinstance(state.rng, torch.Generator)
    assert list(state.m) == [s.name for s in param_specs(MIXED)]
