"""Each adapter, on a config its library can express, against the spec's float64 reference under the suite's
tolerance policy (``spec.tolerance.judge``): the teacher-forced logits and, where mapped, the logits through the
KV cache; and what it cannot express raised as ``NotSupported``, never computed."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest

from conformance.adapters.base import CAPABILITIES, NotSupported
from spec import reference as ref
from spec import tolerance
from spec.config import LM_TINY, TINY, Config
from spec.golden_cases import CONFIGS, GOLDEN_DIR, SMALL, case_params, valid_rows
from spec.init import init_params
from spec.numerics import Numerics
from spec.weights_io import save_weights

pytest.importorskip("torch")
pytest.importorskip("transformers")

MARIAN = SMALL.replace(activation="silu", attention_bias=True, logits_bias=True, positions="sinusoidal_halves",
                       layer_norm_eps=1e-5)
GPT2 = CONFIGS["lm_tiny_gpt2_hf"]
# adapter -> a config it expresses (its dtype set per test), one it does not
CASES = {"nn_transformer": (SMALL.replace(norm_first=True, activation="gelu"), TINY),
         "nn_transformer_autocast": (SMALL, TINY),
         "hf_marian": (MARIAN, TINY), "hf_gpt2": (GPT2, LM_TINY)}
DTYPES = {"nn_transformer_autocast": ("bfloat16",)}


def _load(adapter, c, tmp_path):
    path = tmp_path / f"{c.dtype}.safetensors"
    params = init_params(c, 0, observable=True)
    save_weights(path, c, params)
    backend = importlib.import_module(f"certify.adapters.{adapter}").make_backend()
    assert backend.supports <= CAPABILITIES and c.dtype in backend.supports
    return backend.load(path), ref.as_float64(params, c), backend


def _tokens(c, seed=0):
    rng = np.random.default_rng(seed)
    src, tgt = rng.integers(3, c.vocab_size, (2, 7)), rng.integers(3, c.vocab_size, (2, 6))
    tgt[:, 0] = c.bos_id
    src[1, 4:] = tgt[1, 5:] = c.pad_id
    return (None if c.decoder_only else src), tgt


def _judge(c, P, src, tgt, logits):
    fwd = (lambda nx: ref.LanguageModel(P, c, nx).forward(tgt)) if c.decoder_only else (
        lambda nx: ref.forward(P, src, tgt, c, nx))
    exact, faithful = (valid_rows(fwd(Numerics(m)), tgt, c.pad_id) for m in ("exact", c.dtype))
    verdict = tolerance.judge(valid_rows(logits, tgt, c.pad_id), exact, tolerance.error_stats(faithful, exact,
                                                                                               c.dtype))
    assert verdict.ok, verdict.reason()


@pytest.mark.parametrize("dtype", ("float32", "bfloat16"))
@pytest.mark.parametrize("adapter", CASES)
def test_logits_within_the_contract(adapter, dtype, tmp_path):
    if dtype not in DTYPES.get(adapter, (dtype,)):
        pytest.skip(f"{adapter} runs {DTYPES[adapter]} only")
    c = CASES[adapter][0].replace(dtype=dtype, param_dtype=dtype)
    model, P, backend = _load(adapter, c, tmp_path)
    src, tgt = _tokens(c)
    logits, inter = model.forward(src, tgt)
    assert logits.dtype == np.float32 and logits.shape == (*tgt.shape, c.vocab_size) and inter == {}
    _judge(c, P, src, tgt, logits)
    if "cache" in backend.supports:
        _judge(c, P, src, tgt, model.decode_steps(src, tgt, chunks=[2, 1, 3]))


@pytest.mark.parametrize("adapter", CASES)
def test_what_the_library_cannot_express_is_not_supported(adapter, tmp_path):
    c = CASES[adapter][1].replace(dtype="bfloat16")
    with pytest.raises(NotSupported, match="heads are d_model / n_heads"):
        _load(adapter, c, tmp_path)[0].forward(*_tokens(c))


@pytest.mark.parametrize(("adapter", "config"), (("hf_marian", "tiny_marian_hf"), ("hf_gpt2", "lm_tiny_gpt2_hf")))
def test_golden_cases_in_the_library_shapes_load(adapter, config, tmp_path):
    """The golden cases on the configs kept for MarianMTModel's and GPT2LMHeadModel's shapes (a forward and a
    KV-cache case, fp32 and bf16) load into the library: the suite measures them, not "not supported"."""
    metas, shapes = [json.loads(p.read_text()) for p in sorted(GOLDEN_DIR.glob("*/meta.json"))], CONFIGS[config]
    metas = [m for m in metas if Config.from_dict(m["config"]).replace(dtype=shapes.dtype,
                                                                       param_dtype=shapes.param_dtype) == shapes]
    assert sorted(m["kind"] for m in metas) == ["forward", "forward", "incremental", "incremental"]
    backend = importlib.import_module(f"certify.adapters.{adapter}").make_backend()
    for meta in metas:
        c, params = case_params(meta)
        save_weights(tmp_path / "case.safetensors", c, params)
        backend.load(tmp_path / "case.safetensors")
