"""Train a decoder-only model on the reverse task (``spec.demo.lm_reverse_batch``) through the common API and save
it: the trained weights of the bf16 greedy golden case of the decoder-only model (``spec.golden_lm``). No dropout,
no label smoothing; 2000 steps of 64 rows reverse 88.5% of held-out sequences exactly (``lm_reverse.json``).

    python -m tools.train_lm_reverse --backend torch --threads 1 --save spec/golden_inputs/lm_reverse.safetensors

The weights are stored in bf16 (each fp32 weight rounded once) beside a JSON of how they were made.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

from spec.api import BACKENDS
from spec.data_parallel_cli import HelpFormatter
from spec.demo import BATCH, DEMO_CONFIG, TRAIN_CONFIG, heldout, lm_reverse_batch
from spec.training import TrainConfig
from spec.weights_io import save_weights
from text import cli

LM_CONFIG = DEMO_CONFIG.replace(n_encoder_layers=0, n_decoder_layers=3, norm_first=True, dropout=0.0)
STEPS = 2000


def train(T, steps: int, seed: int = 0):
    """``steps`` of ``lm_train_step`` from ``LanguageModel(LM_CONFIG, seed)``: -> (model, last loss)."""
    model = T.LanguageModel(LM_CONFIG, seed=seed)
    train_config = TrainConfig(label_smoothing=0.0, warmup_steps=TRAIN_CONFIG.warmup_steps)
    state = T.init_train_state(model, train_config, seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        loss, model, state = T.lm_train_step(model, state, lm_reverse_batch(rng, LM_CONFIG, BATCH))
    return model, float(loss)


def exact_match(T, model, size: int = 200) -> float:
    """Greedy continuations of held-out prompts (the sequence and EOS) that are the reversed sequence and EOS."""
    src, expected = (a[:size] for a in heldout(LM_CONFIG))
    prompt = np.concatenate([np.full((size, 1), LM_CONFIG.bos_id), src], axis=1)
    out = np.asarray(T.generate(model, prompt, expected.shape[1], temperature=0.0))
    out = np.pad(out, ((0, 0), (0, expected.shape[1] - out.shape[1])))
    return float((out == expected).all(axis=1).mean())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tools.train_lm_reverse", description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument("--backend", choices=BACKENDS, required=True)
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--threads", type=int)
    p.add_argument("--save", type=Path, required=True, help="the bf16 safetensors file to write")
    args = p.parse_args(argv)
    T = cli.load_backend(args.backend, args.threads)
    model, loss = train(T, args.steps)
    params = T.params_of(model)
    save_weights(args.save, LM_CONFIG.replace(param_dtype="bfloat16"),
                 {k: v.astype(ml_dtypes.bfloat16) for k, v in params.items()})
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(v).tobytes() for v in params.values())).hexdigest()
    info = {"command": "python -m tools.train_lm_reverse " + " ".join(sys.argv[1:] if argv is None else argv),
            "backend": T.__name__,
            "steps": args.steps, "batch": BATCH, "final_loss": loss, "heldout_exact_match": exact_match(T, model),
            "trained_config": LM_CONFIG.to_dict(), "sha256_fp32_as_trained": digest,
            "stored_as": "bfloat16: each fp32 weight rounded once to nearest even", "version": T.__version__}
    args.save.with_suffix(".json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    print(json.dumps({k: info[k] for k in ("final_loss", "heldout_exact_match")}))


if __name__ == "__main__":
    main()
