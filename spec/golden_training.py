"""Training golden cases: the loss, every gradient and the weights after Adam steps (spec.training, spec.backward).

Kind "train". Each case is a short training run of one config from seeded weights (the recipe of
``golden_cases.make_params``): ``STEPS`` Adam steps with ``TRAIN_CONFIG`` (the paper's Adam and schedule, a short
warmup so each step moves a weight visibly in fp32 and bf16), one batch per step, dropout off. Inputs (int64):

    src (STEPS, B, S), tgt_in (STEPS, B, T), tgt_out (STEPS, B, T)    batch i feeds step i + 1; rows are padded
                                                                      in the source and in the targets

Expected (float64, the exact trajectory: float64 weights, ``spec.backward``'s exact gradient, float64 Adam):

    loss                 (STEPS,)  the loss of batch i at the weights before step i + 1 (loss[0]: initial weights)
    grad.<name>          the gradient of every parameter at the initial weights, on batch 0
    params_1.<name>      every parameter after the first step
    params_<STEPS>.<name>  every parameter after the last step
    undecided_<step>.<name>  bool: elements whose Adam steps a conformant backend may take with the other sign

In mixed precision (``dtype="bfloat16", param_dtype="float32"``) the exact trajectory's model computes with its
float64 master weights rounded to bf16 (rule 0: the definition of the bf16 model, not a numerics error); in fp32 it
computes with them as they are.

Sampling, for the 5 MB budget: a stored tensor is ``sampled(x, fraction, min_elements)``, the elements of the
flattened tensor at evenly spread indices (every row and column of a weight is hit, since the spacing is not a
divisor of its width); ``meta["train"]["sampling"]`` gives (fraction, min_elements) per group. The tiny fp32 case
stores every gradient whole (the tiny mixed case a quarter: its bf16-sized errors need no more to be measured),
the small cases 1/64 of every gradient; the weights after steps 1/16 (tiny) and 1/64 (small), at least 16 elements
of each tensor. The stored parts pin the spec's numbers (``golden --check``); a
backend is judged on whole tensors, against the exact run recomputed live (``runs``: seconds), whose stored parts
the conformance suite first checks against the case, bit for bit.

``meta["tensors"]`` holds the faithful trajectory's error per tensor, measured on the whole tensor
(``spec.backward``'s ideal backward in ``Numerics(c.dtype)``, fp32 master weights and fp32 Adam state): the loss
and gradients in ulps of ``c.dtype`` at the tensor's scale (``tolerance.error_stats``), the weights in units of the
summed learning rate (``tolerance.update_error_stats``), on the elements whose steps are decided (the undecided
ones are stored as ``undecided_<step>.<name>`` masks: ``spec.tolerance``). Whole tensors, because in mixed
precision gradient errors are sparse and large where a pre-activation near zero takes the other side of a ReLU:
in small mixed the ideal's worst element of ``decoder.layers.2.ffn.b_1`` (179 bf16 ulps) lies outside the stored
sample, while impl_jax's flips (180 and 143) land inside it. ``spec.golden_training_judge`` reads a case and judges
a backend's run by ``tolerance.judge_gradient`` and ``judge_update``.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np

from spec import golden_cases, tolerance, training
from spec.config import Config
from spec.numerics import Numerics
from spec.trajectory import batches_of, trajectory

STEPS = 3
TRAIN_CONFIG = training.TrainConfig(warmup_steps=10)
EXACT = Numerics("exact")


def sampled(x: np.ndarray, fraction: float, min_elements: int) -> np.ndarray:
    """The stored part of ``x``: ``max(min_elements, ceil(fraction * n))`` of its n elements (all if fewer), at
    evenly spread indices of the flattened tensor, as a 1-d array (the whole tensor, unflattened, if fraction 1).

    Raises:
        ValueError: if ``fraction`` is outside (0, 1] or ``min_elements`` < 1.
    """
    if not 0.0 < fraction <= 1.0 or min_elements < 1:
        raise ValueError(f"sampled: fraction {fraction!r} must lie in (0, 1], min_elements {min_elements!r} >= 1")
    x = np.asarray(x)
    if fraction == 1.0:
        return x
    n = x.size
    m = min(n, max(min_elements, int(np.ceil(fraction * n))))
    return x.reshape(-1)[np.unique(np.linspace(0, n - 1, m).round().astype(int))]


@dataclasses.dataclass(frozen=True)
class TrainCase:
    """One training golden case: config preset, compute dtype (parameters fp32), seed, batch shape, and the
    sampling (fraction, min_elements) of the gradients and of the weights after steps (module docstring)."""
    name: str
    cfg: str
    dtype: str
    seed: int
    B: int
    S: int
    T: int
    grad_sampling: tuple[float, int]
    params_sampling: tuple[float, int]


TRAIN_CASES = (
    TrainCase("train_tiny_float32", "tiny", "float32", 21, 3, 9, 8, (1.0, 1), (1 / 16, 16)),
    TrainCase("train_tiny_bfloat16_params_float32", "tiny", "bfloat16", 21, 3, 9, 8, (1 / 4, 16), (1 / 16, 16)),
    TrainCase("train_small_float32", "small", "float32", 22, 3, 10, 8, (1 / 64, 16), (1 / 64, 16)),
    TrainCase("train_small_bfloat16_params_float32", "small", "bfloat16", 22, 3, 10, 8, (1 / 64, 16), (1 / 64, 16)),
    # decoder-only, next-token prediction on tokens (B, T + 1) (S unused)
    TrainCase("lm_train_tiny_float32", "lm_tiny", "float32", 23, 3, 0, 9, (1.0, 1), (1 / 16, 16)),
    TrainCase("lm_train_tiny_bfloat16_params_float32", "lm_tiny", "bfloat16", 23, 3, 0, 9, (1 / 4, 16), (1 / 16, 16)),
    # the checkpoint options of spec.config: Marian's layers in mixed precision, GPT-2's in fp32
    TrainCase("train_tiny_marian_bfloat16_params_float32", "tiny_marian", "bfloat16", 24, 3, 9, 8, (1 / 4, 16),
              (1 / 16, 16)),
    TrainCase("lm_train_tiny_gpt2_float32", "lm_tiny_gpt2", "float32", 25, 3, 0, 9, (1.0, 1), (1 / 16, 16)),
)
CASES = {case.name: case for case in TRAIN_CASES}


def make_batches(c: Config, case: TrainCase, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``STEPS`` batches: src (STEPS, B, S), tgt_in and tgt_out (STEPS, B, T) int64. Each batch has a full-length
    row and padded rows (source and target lengths drawn from 3 up); a target row is BOS + y[:n-1] in, y[:n-1] +
    EOS out, both padded after n. Decoder-only: tokens (STEPS, B, T + 1), rows BOS + y + EOS, padded."""
    if c.decoder_only:
        tokens = np.full((STEPS, case.B, case.T + 1), c.pad_id, np.int64)
        for i in range(STEPS):
            lengths = rng.integers(3, case.T + 1, case.B)
            lengths[i % case.B] = case.T + 1
            for b, n in enumerate(lengths):
                tokens[i, b, :n] = [c.bos_id, *rng.integers(3, c.vocab_size, n - 2), c.eos_id]
        return {"tokens": tokens}
    src = np.full((STEPS, case.B, case.S), c.pad_id, np.int64)
    tgt_in = np.full((STEPS, case.B, case.T), c.pad_id, np.int64)
    tgt_out = tgt_in.copy()
    for i in range(STEPS):
        src_lens, tgt_lens = rng.integers(3, case.S, case.B), rng.integers(3, case.T, case.B)
        src_lens[i % case.B], tgt_lens[(i + 1) % case.B] = case.S, case.T      # one full row each, not the same
        for b in range(case.B):
            s, n = src_lens[b], tgt_lens[b]
            src[i, b, :s] = rng.integers(3, c.vocab_size, s)
            y = rng.integers(3, c.vocab_size, n - 1)                           # (n - 1,) body tokens
            tgt_in[i, b, :n] = [c.bos_id, *y]
            tgt_out[i, b, :n] = [*y, c.eos_id]
    return {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out}


def undecided_mask(grads: list[dict], faithful: list[dict], name: str, steps: int, c: Config) -> np.ndarray:
    """Elements of weight ``name`` whose Adam steps up to ``steps`` a conformant backend may take differently: at
    some step the exact gradient lies within ``tolerance.UPDATE_MARGIN`` times the gradient tolerance of zero, or
    within ``UPDATE_EPS_SENSITIVE * adam_eps`` (``spec.tolerance``). Bool, the weight's shape."""
    near = np.zeros(np.shape(grads[0][name]), bool)
    for t in range(steps):
        g = grads[t][name]
        tol = tolerance.gradient_tolerance_abs(tolerance.error_stats(faithful[t][name], g, c.dtype))
        near |= np.abs(g) <= max(tolerance.UPDATE_MARGIN * tol, tolerance.UPDATE_EPS_SENSITIVE * TRAIN_CONFIG.adam_eps)
    return near


def runs(params: dict[str, np.ndarray], batches: list[tuple[np.ndarray, np.ndarray, np.ndarray]], c: Config
         ) -> tuple[dict, dict, dict]:
    """The exact and the faithful trajectory of a case, every tensor whole, in the form ``judge`` takes a backend's
    run (``result``), and the undecided masks: (exact, faithful, {step: {name: bool mask}}) for steps 1 and STEPS.
    A few seconds for ``small``: the conformance suite runs it live and judges whole tensors."""
    ex, fa = (trajectory(params, batches, c, TRAIN_CONFIG, nx) for nx in (EXACT, Numerics(c.dtype)))
    as_result = lambda r: {"loss": np.array(r["loss"]), "grad": r["grads"][0],  # noqa: E731
                           **{f"params_{k}": r["params"][k - 1] for k in (1, STEPS)}}
    undecided = {k: {name: undecided_mask(ex["grads"], fa["grads"], name, k, c) for name in params} for k in (1, STEPS)}
    if c.dtype != "float32":
        # In mixed precision most first steps are undecided, so a conformant backend's weights after step 1 differ
        # from the exact ones by up to 2 lr in many places, and every later gradient with them: after step 1 no
        # element's path is decided (docs/decisions.md, "Training tolerances"). They are held to the flip bound.
        undecided[STEPS] = {name: np.ones(np.shape(p), bool) for name, p in params.items()}
    return as_result(ex), as_result(fa), undecided


def stored(exact: dict, undecided: dict, case: TrainCase) -> dict[str, np.ndarray]:
    """The parts of an exact run that a case stores (``sampled`` per the case's sampling)."""
    out = {"loss": exact["loss"]}
    out.update({f"grad.{n}": sampled(g, *case.grad_sampling) for n, g in exact["grad"].items()})
    for k in (1, STEPS):
        out.update({f"params_{k}.{n}": sampled(p, *case.params_sampling) for n, p in exact[f"params_{k}"].items()})
        out.update({f"undecided_{k}.{n}": sampled(u, *case.params_sampling) for n, u in undecided[k].items()})
    return out


def build(case: TrainCase) -> tuple[Config, dict, dict, dict, dict]:
    """The case's config, weights, inputs, expected tensors (stored parts) and meta["tensors"]: the faithful run's
    errors, measured on whole tensors (a conformant backend's ReLU flips may land anywhere, not only where a
    sample looks; in small mixed precision the ideal's worst gradient element lies outside the stored sample)."""
    c = golden_cases.config(case.cfg, case.dtype).replace(param_dtype="float32", dropout=0.0)
    params = golden_cases.make_params(c, case.seed)
    inputs = make_batches(c, case, np.random.default_rng(zlib.crc32(case.name.encode())))
    batches = batches_of(inputs)
    ex, fa, undecided = runs(params, batches, c)
    tensors = {"loss": tolerance.error_stats(fa["loss"], ex["loss"], c.dtype).to_dict()}
    tensors.update({f"grad.{n}": tolerance.error_stats(fa["grad"][n], g, c.dtype).to_dict()
                    for n, g in ex["grad"].items()})
    for k in (1, STEPS):
        lr_total = sum(training.learning_rate(t, c.d_model, TRAIN_CONFIG.warmup_steps) for t in range(1, k + 1))
        for n, p in ex[f"params_{k}"].items():
            und = undecided[k][n]
            stats = tolerance.update_error_stats(fa[f"params_{k}"][n][~und], p[~und], lr_total)
            tensors[f"params_{k}.{n}"] = {**stats.to_dict(), "undecided": int(und.sum())}
    return c, params, inputs, stored(ex, undecided, case), tensors


def write(w, case: TrainCase) -> None:
    """Write ``case`` with ``golden_cases.Writer`` ``w``."""
    c, params, inputs, expected, tensors = build(case)
    lrs = [training.learning_rate(t, c.d_model, TRAIN_CONFIG.warmup_steps) for t in range(1, STEPS + 1)]
    meta = {"kind": "train", "tensors": tensors,
            "train": {"steps": STEPS, "train_config": dataclasses.asdict(TRAIN_CONFIG), "learning_rates": lrs,
                      "stored": ["loss", "grad.<name> (step 1)", "params_1.<name>", f"params_{STEPS}.<name>"],
                      "sampling": {"grad": list(case.grad_sampling), "params": list(case.params_sampling),
                                   "rule": "spec.golden_training.sampled(x, fraction, min_elements)"}},
            "tolerance_policy": {"grad_max_ratio": tolerance.GRAD_MAX_RATIO, "grad_rms_ratio": tolerance.GRAD_RMS_RATIO,
                                 "grad_floor_eps": tolerance.GRAD_FLOOR_EPS,
                                 "update_max_ratio": tolerance.UPDATE_MAX_RATIO,
                                 "update_rms_ratio": tolerance.UPDATE_RMS_RATIO, "update_flip": tolerance.UPDATE_FLIP,
                                 "update_floor": tolerance.UPDATE_FLOOR,
                                 "update_margin": tolerance.UPDATE_MARGIN}}
    w.write(case.name, meta, inputs, expected, c, params, case.seed)


def generate(w) -> None:
    """Write every training case (called by ``golden_recipes.generate``)."""
    for case in TRAIN_CASES:
        write(w, case)
