"""Sampling from the decoder-only model: ``sample`` and ``generate`` against ``spec.sampling``, and
``generate``'s errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import impl_torch
from spec import preset, sampling
from spec import reference as ref
from spec.golden_cases import make_params
from spec.numerics import Numerics
from spec.search import forbid_special

F32 = preset("lm_tiny", dtype="float32", param_dtype="float32")
# Prompts of three lengths, right-padded; with the weights of seed 7 and E[eos] scaled, rows end at EOS at
# different steps, greedy and sampled (their draws' margins are 1.5e-4 and more, far above fp32's differences).
PROMPT = np.array([[1, 5, 9, 13, 7, 30], [1, 8, 0, 0, 0, 0], [1, 4, 22, 17, 0, 0]])


def _spec_error(f, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as e:
        f(*args, **kwargs)
    return str(e.value)


@pytest.mark.parametrize("eos_boost", [2.0, 3.0])
@pytest.mark.parametrize("kwargs", [{"temperature": 0.0}, {"temperature": 0.8, "top_k": 10, "top_p": 0.9, "seed": 3}])
def test_generate_is_spec_sampling_generate(kwargs, eos_boost):
    params = make_params(F32, 7, eos_boost=eos_boost)
    model = impl_torch.from_params(F32, params)
    got = impl_torch.generate(model, PROMPT, 16, **kwargs)
    trace: dict = {}
    want = sampling.generate(ref.as_float64(params, F32), PROMPT, F32, Numerics("float32"), 16, trace=trace,
                             **kwargs)
    assert min(min(d.values()) for row in trace["rows"] for d in row) > 1e-5  # decisions fp32 cannot flip
    assert got.dtype == torch.int64 and np.array_equal(got.numpy(), want)
    lengths = (want != F32.pad_id).sum(axis=1)
    assert len(set(lengths.tolist())) > 1 and (want == F32.eos_id).any()      # rows end at EOS at several steps
    # Torch, NumPy and list prompts give the same; the model's mode changes nothing.
    assert torch.equal(impl_torch.generate(model.train(), torch.as_tensor(PROMPT).tolist(), 16, **kwargs), got)


def test_generate_stops_early_and_a_row_does_not_depend_on_the_others():
    """Row b's draws depend on its prompt, the seed, b and the step only (``spec.sampling.uniforms``): other
    prompts in the other rows, of other lengths, leave its tokens as they were."""
    model = impl_torch.from_params(F32, make_params(F32, 7, eos_boost=3.0))
    kwargs = {"temperature": 1.0, "top_p": 0.95, "seed": 11}
    batch = impl_torch.generate(model, PROMPT, 16, **kwargs)
    assert batch.shape[1] < 16
    for b in range(len(PROMPT)):
        others = np.zeros((3, 9), np.int64)
        others[:, :2] = [1, 40]
        others[b, :6] = PROMPT[b]
        others[(b + 1) % 3, 2:9] = np.arange(41, 48)
        out = impl_torch.generate(model, others, 16, **kwargs)
        n = int((batch[b] != F32.pad_id).sum())
        assert torch.equal(out[b, :n], batch[b, :n]) and (out[b, n:] == F32.pad_id).all()


SETTINGS = [(0.0, None, 1.0), (1.0, None, 1.0), (0.7, 5, 1.0), (1.3, None, 0.8), (0.8, 10, 0.9), (2.0, 1, 1.0),
            (1.0, 3, 0.3), (0.5, None, 0.05)]


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), SETTINGS)
def test_sample_is_spec_sampling_sample(temperature, top_k, top_p):
    """Logits on 0.5 steps tie often (ties go to the lower id, at the top-k cut and in the argmax); where a draw
    is further than 1e-5 from a top-p or inverse-CDF boundary, the token is the reference's."""
    B = 256
    logits = forbid_special(np.round(np.random.default_rng(4).normal(0, 1.5, (B, F32.vocab_size)) * 2) / 2, F32)
    logits = logits.astype(np.float32)
    u = sampling.uniforms(9, B, 1)[:, 0]
    trace: dict = {}
    want = sampling.sample(logits, u, temperature, top_k, top_p, Numerics("float32"), trace)
    got = impl_torch.sampling.sample(torch.from_numpy(logits), torch.from_numpy(u), temperature, top_k, top_p)
    assert got.dtype == torch.int64
    clear = np.array([min(r.get("u_margin", 1), r.get("top_p_margin", 1)) > 1e-5 for r in trace["rows"]])
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(got.numpy()[clear], want[clear])
    if top_k is not None and temperature > 0:  # ties at the top-k cut were exercised
        assert any(r["top_k_margin"] == 0 for r in trace["rows"])


BAD_GENERATE = [
    ({"prompt": [[1, 5, 0], [0, 0, 0]]}, "is empty"),
    ({"prompt": [[1, 0, 5]]}, "right-padded"),
    ({"max_new_tokens": 60}, "max_len"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"temperature": -1.0}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"seed": -1}, "seed"),
]


@pytest.mark.parametrize(("change", "words"), BAD_GENERATE)
def test_generate_raises_the_spec_error(change, words):
    params = make_params(F32, 5)
    args = {"prompt": [[1, 5, 9, 13, 7]], "max_new_tokens": 4, **change}
    prompt = args.pop("prompt")
    want = _spec_error(sampling.generate, ref.as_float64(params, F32), np.asarray(prompt), F32, Numerics("float32"),
                       **args)
    assert words in want
    assert _spec_error(impl_torch.generate, impl_torch.from_params(F32, params), prompt, **args) == want
