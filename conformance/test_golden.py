"""Every golden case (``spec/golden``) against the backend, under the spec's tolerance policy."""

from __future__ import annotations

import numpy as np
import pytest

from conformance import golden as G
from conformance.oracle import golden_training, trajectory
from spec import agreement, golden_cases, golden_recipes, golden_training_judge
from spec.training import TrainConfig


@pytest.mark.parametrize("case", G.cases("layer"), ids=lambda c: c.name)
def test_golden_layer(case, model_for, record):
    out = model_for(case).run_layer(case.meta["layer"], case.meta["prefix"], case.inputs)
    missing = sorted(set(case.expected) - set(out))
    assert not missing, f"{case.meta['layer']} returned no {missing}"
    record({name: G.judge_tensor(case, name, out, {}) for name in case.expected})


@pytest.mark.parametrize("case", [c for c in G.cases("layer") if c.faithful], ids=lambda c: c.name)
def test_golden_rounding_points(case, model_for, record_property):
    """A bf16 layer from given inputs equals the faithful reference bit for bit on at least
    ``spec.agreement.AGREEMENT_MIN`` of its output: the lower bound, which sees a rounding skipped (or added) where
    the error bounds cannot."""
    out = model_for(case).run_layer(case.meta["layer"], case.meta["prefix"], case.inputs)
    agree = {name: agreement.agreement(out[name], f) for name, f in case.faithful.items()}
    record_property("agreement", agree)
    low = {name: round(a, 4) for name, a in agree.items() if a < agreement.AGREEMENT_MIN}
    assert not low, (f"bit-identical to the faithful reference on only {low} of the elements (at least "
                     f"{agreement.AGREEMENT_MIN}): a rounding of spec.numerics skipped or added")


@pytest.mark.parametrize("case", G.cases("forward"), ids=lambda c: c.name)
def test_golden_forward(case, model_for, record):
    """The logits and every recorded intermediate; a backend without "intermediates" on its logits alone."""
    src, tgt_in = _ids(case)
    model = model_for(case)
    whole = "intermediates" in model.supports
    logits, inter = model.forward(src, tgt_in, intermediates=whole)
    got = {**inter, "logits": logits}
    expected = [name for name in case.expected if whole or name.removesuffix("@rows") == "logits"]
    recorded = {name.removesuffix("@rows") for name in expected}
    missing = sorted(recorded - set(got))
    assert not missing, f"forward(intermediates=True) returned no {missing}"
    ids = {"src": src, "tgt": tgt_in}
    for name in recorded:
        assert np.isfinite(np.asarray(got[name], np.float32)).all(), f"{name}: non-finite values (padding included)"
    _assert_fp32_logits(logits, model.config)
    record({name: G.judge_tensor(case, name, got, ids) for name in expected})


def _assert_fp32_logits(logits: np.ndarray, config) -> None:
    """A bf16 model's logits are fp32 (``spec.agreement.BF16_LOGITS_MAX``): the lower bound that sees them rounded
    to bf16, which the error bounds do not."""
    if config.dtype == "bfloat16":
        share, limit = agreement.bf16_representable(logits), agreement.BF16_LOGITS_MAX
        assert share <= limit, \
            f"logits: {share:.1%} of them are bf16 values: rounded to bf16, where the contract keeps them fp32"


# How the target positions enter the KV cache: one token per call (as search does), all of them in one call (a
# prefill), and chunks that write several positions after earlier ones (where a layout mix-up of a multi-token
# write shows).
CHUNKS = {"one_per_call": lambda T: None, "prefill": lambda T: [T], "chunks": lambda T: [2, 1, T - 3]}


@pytest.mark.parametrize("chunks", CHUNKS)
@pytest.mark.parametrize("case", G.cases("incremental"), ids=lambda c: c.name)
def test_golden_incremental(case, chunks, model_for, record):
    src, tgt_in = _ids(case)
    model = model_for(case)
    steps = model.decode_steps(src, tgt_in, chunks=CHUNKS[chunks](tgt_in.shape[1]))
    _assert_fp32_logits(steps, model.config)
    record({"step_logits": G.judge_tensor(case, "step_logits", {"step_logits": steps}, {"tgt": tgt_in})})


@pytest.mark.parametrize("case", G.cases("greedy"), ids=lambda c: c.name)
def test_golden_greedy(case, model_for):
    d = case.meta["decode"]
    tokens = model_for(case).greedy(case.inputs["src"], d["max_new_tokens"])
    np.testing.assert_array_equal(tokens, case.expected["tokens"], err_msg=f"decision margin {d['margin']:.3g}")


@pytest.mark.parametrize("case", G.cases("beam"), ids=lambda c: c.name)
def test_golden_beam(case, model_for):
    d = case.meta["decode"]
    tokens = model_for(case).beam(case.inputs["src"], d["beam_size"], d["alpha"], d["max_new_tokens"])
    np.testing.assert_array_equal(tokens, case.expected["tokens"], err_msg=f"decision margin {d['margin']:.3g}")


@pytest.mark.parametrize("case", G.cases("generate"), ids=lambda c: c.name)
def test_golden_generate(case, model_for):
    """A decoder-only model's greedy and sampled continuations: every draw decided (``spec.golden_lm``)."""
    d = case.meta["decode"]
    settings = {k: d[k] for k in ("temperature", "top_k", "top_p", "seed") if k in d}
    tokens = model_for(case).generate(case.inputs["prompt"], d["max_new_tokens"], **settings)
    np.testing.assert_array_equal(tokens, case.expected["tokens"],
                                  err_msg=f"margins over what the tolerance can move: {d['margins_over_slack']}")


@pytest.mark.parametrize("case", G.cases("sample"), ids=lambda c: c.name)
def test_golden_sample(case, backend):
    """The sampling step alone on logits with exact ties: temperature, top-k, top-p and the draw, in the spec's
    order, with its tie rules (``spec.sampling``)."""
    logits, u, setting = case.inputs["logits"], case.inputs["u"], case.inputs["setting"]
    got = np.empty(len(logits), np.int64)
    for i, settings in enumerate(case.meta["settings"]):
        rows = np.flatnonzero(setting == i)
        got[rows] = backend.sample(logits[rows], u[rows], **settings)
    wrong = {int(i): (int(got[i]), int(case.expected["tokens"][i]), case.meta["settings"][setting[i]])
             for i in np.flatnonzero(got != case.expected["tokens"])}
    assert not wrong, f"row: (drawn, expected, settings): {wrong}"


@pytest.mark.parametrize("case", G.cases("train"), ids=lambda c: c.name)
def test_golden_train(case, model_for, record, record_property):
    """Loss per step, the first step's gradients and the weights after steps 1 and 3 (spec.golden_training), judged
    on whole tensors against the spec's exact run, recomputed live by the oracle (``conformance.oracle``, out of
    ``--mutant``'s reach) and checked against what the case stores."""
    t = case.meta["train"]
    batches = trajectory.batches_of(case.inputs)
    c, params = golden_cases.case_params(case.meta, case.params)
    result = model_for(case).train(batches, TrainConfig(**t["train_config"]), record_after=(1, t["steps"]))
    exact, faithful, undecided = golden_training.runs(params, batches, c)
    if c.dtype == "bfloat16":  # mixed precision: fp32 weight gradients, not bf16 ones (spec.agreement)
        # Judged where the ideal's own share is under the bound, matrices and vectors alike: a gradient that is 0
        # in exact arithmetic (b_k: softmax ignores a constant added to a query's scores) is cancellation residue,
        # often exactly 0.
        judged = [n for n, g in faithful["grad"].items()
                  if agreement.bf16_representable(g) <= agreement.BF16_GRADIENT_MAX]
        assert judged, "no weight gradient judged: the faithful reference's own are all mostly bf16 values"
        representable = {n: agreement.bf16_representable(result["grad"][n]) for n in judged}
        record_property("bf16_representable", representable)
        rounded = {n: round(f, 3) for n, f in representable.items() if f > agreement.BF16_GRADIENT_MAX}
        assert not rounded, f"fp32 weight gradients rounded to bf16 (the share of bf16 values): {rounded}"
    stored = golden_training.stored(exact, undecided, golden_training.CASES[case.name])
    # The live exact run, not the stored one, is what the backend is judged against: on another CPU than the one
    # that wrote the case they agree up to float64 noise.
    assert all(golden_recipes.close_up_to_noise(stored[k], v) for k, v in case.expected.items()), \
        "the spec no longer gives the case"
    record(golden_training_judge.judge(case.meta, exact, undecided, result))


def _ids(case) -> tuple:
    """(src, tgt_in) of a case; a decoder-only case's (None, tokens)."""
    if "tokens" in case.inputs:
        return None, case.inputs["tokens"]
    return case.inputs["src"], case.inputs["tgt_in"]
