"""One system translating the workload's sentences, alone in this process, so that its peak memory is its own:

    python -m bench.translate_worker --framework torch --system ours --dtype bfloat16 --config base \
        --batch 32 --mode beam --repeats 3 --threads 2

Systems: ``ours`` (the framework's impl through ``bench.bench_<framework>``), and in torch's environment
``transformers`` (``MarianMTModel``) and ``ctranslate2`` (``--dtype`` is then its compute type). One untimed pass
over every batch first (compilation, first allocations), then ``--repeats`` timed passes. Prints one JSON object:
the seconds of each pass, the tokens one pass generates, the peak resident memory of the process and its resident
memory before the model was built (the framework's own), and the first batch's translations.
"""

from __future__ import annotations

import argparse
import importlib
import json
from typing import Any

import numpy as np

from bench import translate_common as tc
from bench.common import bench_params, clock, rss_mb
from spec.api import BACKENDS


def _framework(args: argparse.Namespace) -> Any:
    """The framework's bench module, imported and set up (torch: ``--threads`` intra-op threads)."""
    fw = importlib.import_module(f"bench.bench_{args.framework}")
    fw.setup("cpu")
    if args.framework == "torch":
        import torch
        torch.set_num_threads(args.threads)
    return fw


def _system(args: argparse.Namespace, fw: Any) -> tuple[str, Any]:
    """(subject name, ``search(src, max_new_tokens, beam_size, alpha) -> tokens``) of the system asked for."""
    dtype = "float32" if args.system == "ctranslate2" else args.dtype
    config = tc.translate_config(args.config, dtype)
    params = bench_params(config)
    if args.system == "ours":
        model = fw.ours(config, params, "cpu")
        return model.name, lambda src, n, k, a: (model.greedy(src, n) if k == 1 else model.beam(src, n, k))
    from bench import translate_peers
    if args.system == "transformers":
        peer = translate_peers.Marian(config, params)
    else:
        peer = translate_peers.CTranslate2(config, params, args.dtype, args.threads)
    return peer.name, peer.search


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    fw = _framework(args)
    before = rss_mb()
    name, search = _system(args, fw)
    config = tc.translate_config(args.config, "float32")
    batches = tc.batches(config, tc.sentences(config, tc.sentence_count(args.batch)), args.batch)
    beam = 1 if args.mode == "greedy" else tc.BEAM_SIZE

    def one_pass() -> list[np.ndarray]:
        return [search(src, tc.NEW_TOKENS, beam, tc.ALPHA) for src in batches]

    start = clock()
    outputs = one_pass()
    first = clock() - start
    times = []
    for _ in range(args.repeats):
        start = clock()
        one_pass()
        times.append(clock() - start)
    tokens = sum(len(row) for out in outputs for row in tc.unpad(config, out))
    print(json.dumps({"subject": name, "first_s": first, "times_s": times, "tokens": tokens,
                      "peak_rss_mb": rss_mb(), "framework_rss_mb": before,
                      "translations": tc.unpad(config, outputs[0])}))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--framework", required=True, choices=BACKENDS)
    p.add_argument("--system", required=True, choices=("ours", "transformers", "ctranslate2"))
    p.add_argument("--dtype", required=True, help="bfloat16 or float32; ctranslate2: its compute type")
    p.add_argument("--config", default="base")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--mode", default="greedy", choices=("greedy", "beam"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="torch's intra-op threads and ctranslate2's")
    return p


if __name__ == "__main__":
    main()
