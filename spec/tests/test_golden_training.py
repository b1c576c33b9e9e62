"""The faithful backward, the training golden cases and the gradient tolerance policy (spec.tolerance)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from spec import (
    backward,
    golden_cases,
    golden_recipes,
    golden_training,
    golden_training_judge,
    tolerance,
    training,
    trajectory,
)
from spec import reference as ref
from spec.config import TINY
from spec.init import init_params
from spec.numerics import Numerics

SRC = np.array([[5, 9, 17, 2, 0, 0], [7, 8, 9, 10, 11, 2]])           # (B, S), row 0 padded
TGT_IN = np.array([[1, 4, 5, 6, 0], [1, 7, 8, 9, 10]])                # (B, T)
TGT_OUT = np.array([[4, 5, 6, 2, 0], [7, 8, 9, 10, 2]])               # (B, T), one padding target
FP32, MIXED = TINY.replace(dtype="float32", param_dtype="float32"), TINY.replace(param_dtype="float32")


MARIAN = dict(activation="silu", attention_bias=True, logits_bias=True, positions="sinusoidal_halves")
GPT2ISH = dict(activation="gelu_tanh", attention_bias=True, positions="learned", scale_embedding=False, norm_first=True)


@pytest.mark.parametrize("c", [FP32, MIXED, FP32.replace(norm_first=True), MIXED.replace(**MARIAN),
                               MIXED.replace(**GPT2ISH), FP32.replace(**{**GPT2ISH, "activation": "gelu"})],
                         ids=["fp32", "mixed", "fp32_pre_ln", "mixed_marian", "mixed_gpt2", "fp32_gelu"])
def test_faithful_forward_is_the_reference_forward_bit_for_bit(c):
    """The backward's own forward rounds where spec.reference does: the gradient is of the faithful model."""
    P, nx = ref.as_float64(init_params(c, 5, observable=True), c), Numerics(c.dtype)
    grads = {k: np.zeros_like(v) for k, v in P.items()}
    memory, _ = backward.encoder(P, grads, SRC, c, nx)
    logits, _ = backward.decoder(P, grads, TGT_IN, memory, SRC, c, nx)
    np.testing.assert_array_equal(logits, ref.forward(P, SRC, TGT_IN, c, nx))


def test_faithful_fp32_backward_is_a_few_ulps_from_float64():
    params = init_params(FP32, 6, observable=True)
    loss, exact = backward.loss_and_gradients(params, SRC, TGT_IN, TGT_OUT, FP32)
    loss32, faithful = backward.loss_and_gradients(params, SRC, TGT_IN, TGT_OUT, FP32, nx=Numerics("float32"))
    assert abs(loss32 - loss) <= tolerance.EPS["float32"] * loss
    for name in exact:
        s = tolerance.error_stats(faithful[name], exact[name], "float32")
        assert faithful[name].astype(np.float32).astype(np.float64).tolist() == faithful[name].tolist(), name
        assert s.rms_eps <= 8 and s.max_eps <= 64, (name, s)       # one rounding per product, a few products deep


def test_mixed_backward_rounds_cotangents_to_bf16():
    """Mixed precision is far coarser than fp32 (bf16 cotangents) yet the gradients stay fp32 values."""
    params = init_params(MIXED, 6, observable=True)
    _, exact = backward.loss_and_gradients(params, SRC, TGT_IN, TGT_OUT, MIXED)
    _, mixed = backward.loss_and_gradients(params, SRC, TGT_IN, TGT_OUT, MIXED, nx=Numerics("bfloat16"))
    rms = [tolerance.error_stats(mixed[k], exact[k], "float32").rms_eps for k in exact]
    assert np.median(rms) > 2.0 ** 10                                 # bf16-sized errors, in fp32 ulps
    assert all(np.array_equal(g.astype(np.float32), g) for g in mixed.values())


def test_backward_rejects_a_numerics_other_than_the_configs():
    with pytest.raises(ValueError, match="numerics 'bfloat16' must be 'exact' or the config's dtype"):
        backward.loss_and_gradients(init_params(FP32, 0), SRC, TGT_IN, TGT_OUT, FP32, nx=Numerics("bfloat16"))


def test_sampled_and_policy_reject_bad_input():
    with pytest.raises(ValueError, match="fraction"):
        golden_training.sampled(np.zeros(4), 0.0, 1)
    assert golden_training.sampled(np.arange(100.0), 0.1, 16).tolist() == np.linspace(0, 99, 16).round().tolist()
    stats = tolerance.update_error_stats(np.zeros(3), np.zeros(3), 1.0)
    with pytest.raises(ValueError, match="judge_update"):
        tolerance.judge_update(np.zeros(3), np.zeros(3), stats, "float16", np.zeros(3, bool))
    with pytest.raises(ValueError, match="judge_gradient"):
        tolerance.judge_gradient(np.zeros(3), np.zeros(3), stats)
    with pytest.raises(ValueError, match="lr_total"):
        tolerance.update_error_stats(np.zeros(3), np.zeros(3), 0.0)


# ----------------------------------------------------------------- the golden cases

@pytest.fixture(scope="module", params=sorted(golden_training.CASES))
def case(request):
    meta, c, params, inputs, expected = golden_training_judge.load_case(golden_cases.GOLDEN_DIR, request.param)
    batches = trajectory.batches_of(inputs)
    exact, _, undecided = golden_training.runs(params, batches, c)
    return {"meta": meta, "c": c, "params": params, "batches": batches, "expected": expected,
            "case": golden_training.CASES[request.param], "exact": exact, "undecided": undecided}


def _run(k: dict, tc: training.TrainConfig = golden_training.TRAIN_CONFIG) -> dict:
    """A backend with the ideal numerics of the case's dtype: the faithful trajectory, as ``judge`` takes it."""
    r = trajectory.trajectory(k["params"], k["batches"], k["c"], tc, Numerics(k["c"].dtype))
    return {"loss": r["loss"], "grad": r["grads"][0], "params_1": r["params"][0],
            f"params_{golden_training.STEPS}": r["params"][-1]}


def test_case_inputs_are_padded_and_recorded(case):
    meta, c = case["meta"], case["c"]
    assert meta["kind"] == "train" and c.param_dtype == "float32" and c.dropout == 0.0
    assert meta["train"]["train_config"] == dataclasses.asdict(golden_training.TRAIN_CONFIG)
    for batch in case["batches"]:
        if c.decoder_only:  # tokens: BOS, body, EOS, then padding
            (tokens,) = batch
            assert (tokens == c.pad_id).any() and (tokens[:, 0] == c.bos_id).all()
            assert ((tokens == c.eos_id).sum(axis=1) == 1).all()
            continue
        src, tgt_in, tgt_out = batch
        assert (src == c.pad_id).any() and (tgt_out == c.pad_id).any() and (tgt_in[:, 0] == c.bos_id).all()
        assert ((tgt_in == c.pad_id) == (tgt_out == c.pad_id)).all()


def test_recorded_numbers_match_a_recomputation(case):
    """Expected tensors and the faithful errors in meta, recomputed (to float64 noise: CPUs' kernels differ)."""
    _, _, _, expected, tensors = golden_training.build(case["case"])
    assert sorted(expected) == sorted(case["expected"])
    for key, value in expected.items():
        assert golden_recipes.close_up_to_noise(value, case["expected"][key]), key
    for key, stats in tensors.items():
        numbers = {f: v for f, v in stats.items() if f != "unit"}
        assert case["meta"]["tensors"][key]["unit"] == stats["unit"], key
        assert {f: case["meta"]["tensors"][key][f] for f in numbers} == pytest.approx(numbers, rel=1e-6, abs=1e-12)


def test_policy_passes_the_faithful_run(case):
    verdicts = golden_training_judge.judge(case["meta"], case["exact"], case["undecided"], _run(case))
    assert all(v.ok for v in verdicts.values()), [k for k, v in verdicts.items() if not v.ok]


def test_live_run_is_what_the_case_stores(case):
    stored = golden_training.stored(case["exact"], case["undecided"], case["case"])
    assert sorted(stored) == sorted(case["expected"])
    assert [k for k in stored if not golden_recipes.close_up_to_noise(stored[k], case["expected"][k])] == []


def _failures(case: dict, result: dict) -> set[str]:
    """The groups (loss, grad, params_1, params_3) with a failed tensor."""
    verdicts = golden_training_judge.judge(case["meta"], case["exact"], case["undecided"], result)
    return {k.split(".")[0] for k, v in verdicts.items() if not v.ok}


def test_policy_fails_a_gradient_scaled_by_a_little(case):
    """One gradient tensor off by 1% fails in fp32; bf16 resolves only ~10% (tolerance module comment)."""
    r, name = _run(case), "decoder.layers.0.ffn.w_1"
    scale = 1.01 if case["c"].dtype == "float32" else 1.2
    assert _failures(case, {**r, "grad": {**r["grad"], name: r["grad"][name] * scale}}) == {"grad"}


def test_policy_fails_label_smoothing_off(case):
    """The gradients always see it; the loss too, but in the decoder-only mixed case: its near-uniform initial
    predictions make the two losses differ by at most 0.034, under its bf16 loss tolerance of one ulp at 4.47."""
    tc = dataclasses.replace(golden_training.TRAIN_CONFIG, label_smoothing=0.0)
    c = case["c"]
    caught = {"grad"} if c.decoder_only and c.dtype == "bfloat16" else {"loss", "grad"}
    assert caught <= _failures(case, _run(case, tc))


def test_policy_fails_padding_counted_in_the_loss(case, monkeypatch):
    def every_position(logits, tgt_out, c, label_smoothing):
        z = np.asarray(logits, np.float64)                                      # (B, T, V)
        q = np.full(z.shape, label_smoothing / z.shape[-1])
        np.put_along_axis(q, tgt_out[..., None], 1.0 - label_smoothing + label_smoothing / z.shape[-1], axis=-1)
        return (np.exp(training.log_softmax(z)) - q) / tgt_out.size
    monkeypatch.setattr(training, "loss_gradient", every_position)
    assert {"grad", "params_1"} <= _failures(case, _run(case))


def test_policy_fails_no_warmup(case, monkeypatch):
    monkeypatch.setattr(training, "learning_rate",
                        lambda step, d_model, warmup, scale=1.0: scale * d_model ** -0.5 * step ** -0.5)
    assert {"params_1", f"params_{golden_training.STEPS}"} <= _failures(case, _run(case))


def test_policy_fails_beta2_in_fp32(case):
    """beta2 shows from step 2 on, by ~1% of a step: visible in fp32 only (tolerance module comment)."""
    if case["c"].dtype != "float32":
        pytest.skip("below bf16's resolution within three steps")
    tc = dataclasses.replace(golden_training.TRAIN_CONFIG, beta2=0.999)
    assert f"params_{golden_training.STEPS}" in _failures(case, _run(case, tc))
