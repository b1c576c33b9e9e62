"""Property-based conformance on random small configs, beyond the golden cases' tiny/small/base.

Hypothesis draws ``N_EXAMPLES[backend]`` examples from a fixed seed (the same ones on every run, no database,
no shrinking): a config (heads 1/3/5, d_k and d_v independent, 1-3 layers per stack, pre- or post-LN, every
checkpoint option of ``spec.config``, bf16 or fp32 activations with parameters stored in either dtype:
``spec.numerics`` rule 0; a small vocabulary, ``max_len`` just above the input lengths), observable weights
from a seed, and right-padded inputs. The float64 ("exact") and contract-faithful references are computed
live, by ``conformance.oracle`` (private copies that ``--mutant`` never reaches). Per example, as the golden cases:

* logits of ``forward(src, tgt_in)`` at non-pad target positions: ``spec.tolerance.judge`` against
  exact, given the faithful reference's own error at the same positions;
* greedy tokens (``max_new_tokens=min(6, max_len)``), exactly, row by row, where exact and faithful
  search agree and the row's decision margin is at least ``DECISION_MARGIN_FACTOR`` times the
  logits tolerance (measured, as ``spec.golden_search`` does, on the teacher-forced forward of the
  greedy output). Other rows are skipped but counted; the test fails unless at least
  ``MIN_COMPARED`` of the examples had tokens compared, so it cannot silently compare nothing.

Failures (a backend exception too) are collected and reported together, each with a ``replay``
call that rebuilds its example; the report records the worst few logits verdicts. To replay one:

    python -c "from conformance.test_random_configs import replay; print(replay('<config json>', SEED,
               [[src ...]], [[tgt_in ...]], backend='torch'))"

(``backend``: the run's ``--backend``, a built-in name or an import path; against a mutant:
``from conformance import mutants; mutants.apply(NAME)`` first).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import hypothesis
import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from conformance import capabilities, plugin
from conformance.adapters.base import NotSupported
from conformance.oracle import ref, search
from spec import tolerance
from spec.config import ACTIVATIONS, DTYPES, POSITIONS, Config
from spec.golden_cases import valid_rows
from spec.init import init_params
from spec.numerics import Numerics
from spec.weights_io import save_weights

# Examples per backend: jax and tf compile each new config and shape, so they run fewer (what an example costs in
# each: docs/decisions.md, "Random configs").
N_EXAMPLES = {"reference": 20, "torch": 20, "jax": 10, "tf": 6}  # a backend not named here: the reference's
MAX_NEW_TOKENS = 6
MIN_COMPARED = 0.5  # of the examples, with greedy tokens compared in a row at least (docs/decisions.md)
SEED = 20240611
Params = dict[str, np.ndarray]




@dataclasses.dataclass(frozen=True)
class Example:
    config: Config
    seed: int          # of init_params(config, seed, observable=True)
    src: np.ndarray    # (B, S) int64, right-padded
    tgt_in: np.ndarray  # (B, T) int64, BOS first, right-padded

    def replay_call(self, backend: str) -> str:
        return (f"replay({self.config.to_json()!r}, {self.seed}, {self.src.tolist()}, {self.tgt_in.tolist()}, "
                f"backend={backend!r})")


@dataclasses.dataclass
class Outcome:
    logits: tolerance.Verdict | None
    rows: int              # greedy rows in the example
    rows_compared: int     # of those, compared exactly (safe margin, exact == faithful)
    problems: list[str]


@st.composite
def examples(draw) -> Example:
    def i(lo: int, hi: int) -> int:
        return draw(st.integers(lo, hi))

    B, S, T = i(1, 3), i(1, 9), i(1, 8)
    dtype = draw(st.sampled_from(DTYPES))
    c = Config(vocab_size=i(8, 40), d_model=2 * i(4, 24), n_heads=draw(st.sampled_from([1, 3, 5])), d_k=i(1, 12),
               d_v=i(1, 12), d_ff=i(4, 64), n_encoder_layers=i(1, 3), n_decoder_layers=i(1, 3),
               max_len=max(S, T) + i(0, 3), dropout=0.1, norm_first=draw(st.booleans()), dtype=dtype,
               param_dtype=draw(st.sampled_from([dtype, *(d for d in DTYPES if d != dtype)])),  # same, else mixed
               activation=draw(st.sampled_from(ACTIVATIONS)), attention_bias=draw(st.booleans()),
               logits_bias=draw(st.booleans()), positions=draw(st.sampled_from(POSITIONS)),
               scale_embedding=draw(st.booleans()), layer_norm_eps=draw(st.sampled_from([1e-6, 1e-5])))
    s = i(0, 2**16)
    rng = np.random.default_rng(s)
    src, tgt_in = rng.integers(1, c.vocab_size, (B, S)), rng.integers(1, c.vocab_size, (B, T))
    tgt_in[:, 0] = c.bos_id
    for b in range(B):
        src[b, i(1, S):] = c.pad_id
        tgt_in[b, i(1, T):] = c.pad_id
    return Example(c, s, src, tgt_in)


def _logits(P: Params, src: np.ndarray, tgt_in: np.ndarray, c: Config) -> tuple[np.ndarray, tolerance.ErrorStats]:
    """Exact logits at non-pad target positions, and the faithful reference's error there."""
    exact = valid_rows(ref.forward(P, src, tgt_in, c, Numerics("exact")), tgt_in, c.pad_id)
    faithful = valid_rows(ref.forward(P, src, tgt_in, c, Numerics(c.dtype)), tgt_in, c.pad_id)
    return exact, tolerance.error_stats(faithful, exact, c.dtype)


def _padded(row: np.ndarray, width: int, pad_id: int) -> np.ndarray:
    return np.pad(row, (0, width - len(row)), constant_values=pad_id)


def check_example(ex: Example, load: Callable) -> Outcome:
    """Judge one example on the model ``load(config, params)`` returns."""
    c, src, tgt_in = ex.config, ex.src, ex.tgt_in
    params = init_params(c, ex.seed, observable=True)
    P = ref.as_float64(params, c)
    exact, stats = _logits(P, src, tgt_in, c)
    n = min(MAX_NEW_TOKENS, c.max_len)
    trace_x, trace_f = {}, {}
    out_x = search.greedy_search(P, src, c, Numerics("exact"), n, trace=trace_x)
    out_f = search.greedy_search(P, src, c, Numerics(c.dtype), n, trace=trace_f)
    # The decisions' tolerance: that of the logits of a teacher-forced forward of the output itself.
    dec_in = np.concatenate([np.full((len(src), 1), c.bos_id), out_x[:, :-1]], axis=1)
    dec_in = np.where(np.cumsum(dec_in == c.eos_id, axis=1) > 0, c.pad_id, dec_in)
    required = tolerance.DECISION_MARGIN_FACTOR * tolerance.logits_tolerance_abs(_logits(P, src, dec_in, c)[1])
    width = max(out_x.shape[1], out_f.shape[1])
    rows = zip(trace_x["rows"], trace_f["rows"], strict=True)
    margins = [min(rx.get("margin", np.inf), rf.get("margin", np.inf)) for rx, rf in rows]
    safe = [b for b, m in enumerate(margins) if m >= required
            and np.array_equal(_padded(out_x[b], width, c.pad_id), _padded(out_f[b], width, c.pad_id))]
    verdict, problems = None, []
    try:
        model = load(c, params)
        verdict = tolerance.judge(valid_rows(model.forward(src, tgt_in)[0], tgt_in, c.pad_id), exact, stats)
        if not verdict.ok:
            problems.append(f"logits out of tolerance: {verdict.reason()}")
        if safe:
            tokens = np.asarray(model.greedy(src, n))
            w = max(width, tokens.shape[1])
            for b in safe:
                got, want = _padded(tokens[b], w, c.pad_id), _padded(out_x[b], w, c.pad_id)
                if not np.array_equal(got, want):
                    problems.append(f"greedy row {b}: {got.tolist()} != reference {want.tolist()} "
                                    f"(margin {margins[b]:.3g}, required {required:.3g})")
            if len(safe) == len(src) and tokens.shape != out_x.shape:
                problems.append(f"greedy tokens shape {tokens.shape} != reference {out_x.shape}")
    except NotSupported:  # a config or a call the backend does not support: the whole check is not supported
        raise
    except Exception as e:  # noqa: BLE001 - a crash is a finding, reported with the replay call
        problems.append(f"{type(e).__name__}: {e}")
    return Outcome(verdict, len(src), len(safe), problems)


def _nearness(v: tolerance.Verdict) -> float:
    """How near its limit a verdict is (1 = at the limit), by the max or the RMS criterion."""
    rms = v.stats.rms_eps / v.rms_eps_allowed if v.rms_eps_allowed else 0.0
    return max(v.stats.max_eps / v.max_eps_allowed, rms)


def replay(config_json: str, seed: int, src: list, tgt_in: list, backend: str = "reference") -> Outcome:
    """Rebuild one example from a failure message and check it again on ``backend``."""
    b = capabilities.CheckedBackend(plugin.backend_module(backend).make_backend())  # as the suite's fixture does

    def load(c: Config, params: dict) -> object:
        path = Path(tempfile.mkdtemp(prefix="replay-")) / "model.safetensors"
        save_weights(path, c, params)
        return b.load(path)

    ex = Example(Config.from_dict(json.loads(config_json)), seed, np.array(src, np.int64), np.array(tgt_in, np.int64))
    return check_example(ex, load)


def test_random_configs(backend, load_model, record, pytestconfig):
    """Every example's logits within tolerance and its safe greedy rows exact (module docstring)."""
    results: list[tuple[Example, Outcome]] = []

    @hypothesis.seed(SEED)
    @settings(max_examples=N_EXAMPLES.get(backend.name, N_EXAMPLES["reference"]), deadline=None, derandomize=True,
              database=None, phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.too_slow])
    @given(examples())
    def run(ex: Example) -> None:
        results.append((ex, check_example(ex, load_model)))

    run()
    name = plugin.backend_name(pytestconfig)  # the --backend of the run: a built-in name or an import path
    failures = [f"example {k} ({ex.config.dtype}/{ex.config.param_dtype}, seed {ex.seed}): " + "; ".join(o.problems)
                + f"\n    {ex.replay_call(name)}" for k, (ex, o) in enumerate(results) if o.problems]
    judged = {f"example{k}.logits": o.logits for k, (_, o) in enumerate(results) if o.logits is not None}
    worst = sorted(judged, key=lambda n: _nearness(judged[n]), reverse=True)
    shown = {n: judged[n] for n in worst if not judged[n].ok or n in worst[:3]}
    try:
        record(shown)
    except AssertionError:
        pass  # the failures below say the same, with the replay calls
    assert not failures, f"{len(failures)} of {len(results)} random examples failed:\n" + "\n".join(failures)
    compared = sum(o.rows_compared > 0 for _, o in results)
    assert compared >= MIN_COMPARED * len(results), (
        f"greedy tokens compared in only {compared} of {len(results)} examples "
        f"({sum(o.rows_compared for _, o in results)} of {sum(o.rows for _, o in results)} rows): "
        "too few decisions had a safe margin")
