"""The ONNX export of impl_torch (``tools.onnx_torch``) in ONNX Runtime (``tools.onnx_translate``) against the NumPy
reference: teacher-forced and step-by-step logits judged by the fp32 tolerance policy the conformance suite judges
a forward with (``spec.tolerance.judge`` against the exact forward, given the fp32-faithful reference's own
error), and greedy tokens identical to ``spec.search.greedy_search``'s, at a batch size and source length other
than the trace's."""

from __future__ import annotations

import numpy as np
import pytest

import impl_torch
import spec.reference as ref
from spec import search, tolerance, weights_io
from spec.config import LM_TINY, TINY
from spec.golden_cases import make_params, random_tokens, valid_rows
from spec.init import init_params
from spec.numerics import Numerics
from tools import onnx_torch as X
from tools import onnx_translate as R

pytest.importorskip("onnxruntime")
C = TINY.replace(dtype="float32", param_dtype="float32")
SEED = 0


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(params, sessions) of the tiny model of ``SEED``: its graphs, written by the command line from a canonical
    weights file."""
    params = init_params(C, SEED, observable=True)
    tmp = tmp_path_factory.mktemp("onnx")
    weights_io.save_weights(tmp / "tiny.safetensors", C, params)
    X.main([str(tmp / "tiny.safetensors"), str(tmp / "out")])
    return params, R.sessions(tmp / "out", threads=1)


@pytest.fixture(scope="module")
def ending(tmp_path_factory):
    """(params, sessions) of weights on which greedy search ends rows with EOS at different steps: the golden
    decoding cases' E[eos] scaled up (``spec.golden_cases.make_params``), here by 4, seed 2; the observable init
    alone repeats one token per row to the limit."""
    params = make_params(C, 2, eos_boost=4.0)
    folder = tmp_path_factory.mktemp("onnx_eos")
    X.export(impl_torch.Transformer(C, params=params), folder)
    return params, R.sessions(folder, threads=1)


def _batch() -> tuple[np.ndarray, np.ndarray]:
    """src (3, 7), tgt_in (3, 6) with padding; the export traced B = 2, S = 5."""
    rng = np.random.default_rng(SEED)
    return random_tokens(rng, C, [7, 3, 5], 7, bos=False), random_tokens(rng, C, [6, 2, 4], 6, bos=True)


def _judge(got: np.ndarray, src: np.ndarray, tgt_in: np.ndarray, params: dict) -> tolerance.Verdict:
    """Logits (B, T, V) at non-pad targets against the exact forward, as conformance/test_random_configs.py."""
    P = ref.as_float64(params, C)
    exact, faithful = (valid_rows(ref.forward(P, src, tgt_in, C, Numerics(m)), tgt_in, C.pad_id)
                       for m in ("exact", "float32"))
    stats = tolerance.error_stats(faithful, exact, "float32")
    return tolerance.judge(valid_rows(got, tgt_in, C.pad_id).astype(np.float64), exact, stats)


def test_teacher_forced_logits_within_the_fp32_tolerance(exported):
    params, sessions = exported
    src, tgt_in = _batch()
    logits, feeds = R.step(sessions[1], tgt_in, R.start(sessions, src))
    assert logits.shape == (3, 6, C.vocab_size) and logits.dtype == np.float32
    assert feeds["self_k.0"].shape == (3, C.n_heads, 6, C.d_k) and feeds["key_mask"].shape == (3, 6)
    verdict = _judge(logits, src, tgt_in, params)
    assert verdict.ok, verdict.reason()


def test_step_by_step_logits_within_the_fp32_tolerance(exported):
    params, sessions = exported
    src, tgt_in = _batch()
    feeds, steps = R.start(sessions, src), []
    for t in range(tgt_in.shape[1]):
        logits, feeds = R.step(sessions[1], tgt_in[:, t:t + 1], feeds)
        steps.append(logits)
    verdict = _judge(np.concatenate(steps, axis=1), src, tgt_in, params)
    assert verdict.ok, verdict.reason()


@pytest.mark.parametrize("weights", ["exported", "ending"])
def test_greedy_tokens_equal_the_reference(weights, request):
    params, sessions = request.getfixturevalue(weights)
    src = random_tokens(np.random.default_rng(3), C, [9, 4, 6, 2], 9, bos=False)
    P, trace = ref.as_float64(params, C), {}
    want = search.greedy_search(P, src, C, Numerics("float32"), 16, trace=trace)
    if weights == "ending":  # rows that end at different steps, and one at the limit
        assert [int((row == C.eos_id).sum()) for row in want] == [1, 1, 1, 0], want
    # Identical tokens are owed only where every decision's margin exceeds twice the logits' tolerance (the suite's
    # rule, spec.tolerance): that of a teacher-forced forward of the answer itself.
    dec_in = np.concatenate([np.full((len(src), 1), C.bos_id), want[:, :-1]], axis=1)
    dec_in = np.where(np.cumsum(dec_in == C.eos_id, axis=1) > 0, C.pad_id, dec_in)
    exact = ref.forward(P, src, dec_in, C, Numerics("exact"))
    stats = tolerance.error_stats(*(valid_rows(x, dec_in, C.pad_id) for x in
                                    (ref.forward(P, src, dec_in, C, Numerics("float32")), exact)), "float32")
    assert trace["margin"] > tolerance.DECISION_MARGIN_FACTOR * tolerance.logits_tolerance_abs(stats)
    np.testing.assert_array_equal(R.greedy(sessions, src, max_new_tokens=16), want)


def test_bad_input_is_refused_before_anything_runs(exported, tmp_path):
    _, sessions = exported
    bf16 = impl_torch.Transformer(TINY, seed=SEED)
    with pytest.raises(ValueError, match="config.dtype='bfloat16': only float32"):
        X.export(bf16, tmp_path / "bf16")
    assert not (tmp_path / "bf16").exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        X.export(impl_torch.Transformer(C, seed=SEED), tmp_path / "file")
    with pytest.raises(ValueError, match="an impl_torch.Transformer is exported, got LanguageModel"):
        X.export(impl_torch.LanguageModel(LM_TINY.replace(dtype="float32", param_dtype="float32")), tmp_path / "lm")
    with pytest.raises(ValueError, match="src"):
        R.greedy(sessions, [[5, C.vocab_size, 2]])

