"""The language-model demo's runs (``tools.lm_demo``, one JSON per backend) side by side: one PNG of the training
and validation losses, and a Markdown report of the final validation losses, the agreement of the backends, and
the generated text with the first token where the backends part.

The agreement criterion: every backend starts from the same weights and sees the same windows with dropout 0, so
only rounding tells them apart. How far rounding alone moves the validation loss is measured by one backend against
itself with its compute in float32 instead of bfloat16 (``--fp32``, the same seed): the bound is the largest
|difference| of those two runs' validation losses over the second half of training. The backends agree if their
final validation losses all lie within that bound of each other.

    python -m tools.lm_report torch.json jax.json tf.json --fp32 torch-fp32.json --png docs/lm_demo.png \
        --md docs/lm_demo.md
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display
import matplotlib.pyplot as plt  # noqa: E402

from tools.train_report import FRAMEWORKS, framework_of  # noqa: E402

SAME = ("steps", "batch", "seed", "prompt")  # what runs compared side by side must share


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(prog="python -m tools.lm_report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path, help="one run per backend, the same settings")
    p.add_argument("--fp32", type=Path, help="one of the backends again with float32 compute: the agreement bound")
    p.add_argument("--png", type=Path, required=True, help="the loss curves")
    p.add_argument("--md", type=Path, help="the Markdown report (default: stdout only)")
    args = p.parse_args(argv)
    runs = sorted((json.loads(f.read_text()) for f in args.files), key=lambda r: FRAMEWORKS.index(framework_of(r)))
    fp32 = json.loads(args.fp32.read_text()) if args.fp32 else None
    check_comparable(runs + ([fp32] if fp32 else []))
    chart(runs, fp32, args.png)
    text = report(runs, fp32, args.png)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(text)
    print(text)
    return text


def check_comparable(runs: list[dict[str, Any]]) -> None:
    """Raises ValueError unless the runs share the settings, the tokenizer and the model (but its dtype)."""
    def key(r: dict[str, Any]) -> tuple:
        config = {k: v for k, v in r["config"].items() if k != "dtype"}
        return (*(r[k] for k in SAME), r["corpus"]["tokenizer_sha256"], json.dumps(config, sort_keys=True),
                json.dumps(r["train_config"], sort_keys=True))
    if len({key(r) for r in runs}) > 1:
        raise ValueError("the runs differ in settings, tokenizer or model: " + ", ".join(framework_of(r) for r in runs))


def agreement(runs: list[dict[str, Any]], fp32: dict[str, Any]) -> dict[str, Any]:
    """The bound (see the module's docstring), the largest difference of the backends' final validation losses,
    and whether it holds."""
    same = next(r for r in runs if framework_of(r) == framework_of(fp32))
    late = [abs(a[1] - b[1]) for a, b in zip(same["evals"], fp32["evals"], strict=True) if a[0] >= fp32["steps"] / 2]
    finals = [r["evals"][-1][1] for r in runs]
    pairs = [abs(a - b) for a, b in itertools.combinations(finals, 2)]
    spread = max(pairs, default=0.0)
    return {"backend": framework_of(fp32), "bound": max(late), "spread": spread, "holds": spread <= max(late)}


def divergence(runs: list[dict[str, Any]], name: str) -> str:
    """Where each pair of backends' ``name`` samples first differ: the new token's position and each one's token."""
    parts = []
    for a, b in itertools.combinations(runs, 2):
        ids_a, ids_b = a["samples"][name]["ids"], b["samples"][name]["ids"]
        i = next((i for i in range(max(len(ids_a), len(ids_b)))
                  if i >= min(len(ids_a), len(ids_b)) or ids_a[i] != ids_b[i]), None)
        pair = f"{framework_of(a)} and {framework_of(b)}"
        parts.append(f"{pair} identical" if i is None else
                     f"{pair} first differ at new token {i + 1} ({_token(a, name, i)} against {_token(b, name, i)})")
    return "; ".join(parts) or "one backend only"


def report(runs: list[dict[str, Any]], fp32: dict[str, Any] | None, png: Path) -> str:
    first = runs[0]
    c, corpus, m = first["config"], first["corpus"], first["machine"]
    lines = [f"# A language model of CPython's documentation, {len(runs)} backend(s)", "",
             f"![losses]({png.name})", "",
             f"Model: decoder-only, d_model {c['d_model']}, {c['n_decoder_layers']} layers, {c['n_heads']} heads, "
             f"d_ff {c['d_ff']}, context {c['max_len']}, byte-level BPE of {corpus['vocab_size']} ids, "
             f"{c['param_dtype']} weights computing in {c['dtype']}, dropout {c['dropout']}. Training: "
             f"{first['steps']} steps of {first['batch']} windows, Adam, warmup {first['train_config']['warmup_steps']}"
             f", lr_scale {first['train_config']['lr_scale']}, seed {first['seed']}; the same weights and windows "
             f"in every backend.", "",
             f"Corpus: `pydoc_data.topics`, {corpus['train_tokens']:,} training tokens; held out: "
             f"{len(corpus['heldout_topics'])} topics ({corpus['heldout_topics'][0]} … "
             f"{corpus['heldout_topics'][-1]}), {corpus['heldout_targets']:,} targets in "
             f"{corpus['heldout_windows']} windows.", "",
             f"Machine: {m['cpu']}, {m['cores']} cores ({', '.join(m['simd'])}), {first['threads']} thread(s) per "
             f"run, Python {m['python']}, {m['date']}.", "",
             "Times: wall-clock seconds of training steps, of the evaluations, and of the whole run, and the run's "
             "CPU seconds (the process's own: the machine is shared, and the 1-minute load average during the runs "
             f"was {_loads(runs, fp32)}).", "",
             "| backend | compute | final validation loss | perplexity | training s | evaluation s | wall s | CPU s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in runs + ([fp32] if fp32 else []):
        _, val, ppl, _ = r["evals"][-1]
        lines.append(f"| impl_{framework_of(r)} | {r['config']['dtype']} | {val:.4f} | {ppl:.2f} | "
                     f"{r['train_s']:.0f} | {r['eval_s']:.0f} | {r['wall_s']:.0f} | {r['cpu_s']:.0f} |")
    u = first["unigram"]
    lines += [f"| unigram (add-one, training counts) | | {u['cross_entropy']:.4f} | {math.exp(u['cross_entropy']):.1f}"
              " | | | | |", ""]
    lines += _agreement_lines(runs, fp32) + _sample_lines(runs)
    return "\n".join(lines) + "\n"


def _agreement_lines(runs: list[dict[str, Any]], fp32: dict[str, Any] | None) -> list[str]:
    if fp32 is None:
        return ["Agreement: not judged (no `--fp32` run to bound rounding by).", ""]
    a = agreement(runs, fp32)
    verdict = "holds" if a["holds"] else "does not hold"
    return [f"Agreement: the largest difference of the backends' final validation losses is {a['spread']:.4f} "
            f"nats; rounding alone (impl_{a['backend']} bfloat16 against float32, largest |difference| over the "
            f"second half of training) moves it by up to {a['bound']:.4f}: the criterion {verdict}.", ""]


def _sample_lines(runs: list[dict[str, Any]]) -> list[str]:
    prompt = runs[0]["prompt"]
    lines = []
    for name, s in runs[0]["samples"].items():
        how = "greedy" if not s["temperature"] else f"temperature {s['temperature']}, top_p {s['top_p']}"
        lines += [f"Samples, {how}, prompt `{prompt}`, {len(s['ids'])} new tokens at most, seed "
                  f"{runs[0]['seed']}: {divergence(runs, name)}.", "", "| backend | continuation |", "|---|---|"]
        lines += [f"| impl_{framework_of(r)} | {_cell(r['samples'][name]['text'])} |" for r in runs]
        lines.append("")
    return lines


def _loads(runs: list[dict[str, Any]], fp32: dict[str, Any] | None) -> str:
    loads = [x for r in runs + ([fp32] if fp32 else []) for x in r["load_average"]]
    return f"{min(loads):.1f} to {max(loads):.1f} on {runs[0]['machine']['cores']} cores"


def _token(run: dict[str, Any], name: str, i: int) -> str:
    tokens = run["samples"][name]["tokens"]
    return f"`{tokens[i]!r}`" if i < len(tokens) else "(ended)"


def _cell(text: str) -> str:
    """Text in one table cell: newlines shown as ⏎, pipes escaped."""
    return text.replace("|", "\\|").replace("\n", " ⏎ ")


def chart(runs: list[dict[str, Any]], fp32: dict[str, Any] | None, path: Path) -> Path:
    """One PNG: left, each backend's training loss per step (thin) and validation loss (markers), the unigram
    baseline dotted; right, each run's validation loss minus the first backend's, the float32 run's dashed (the
    curves on the left lie on top of each other); colours as the bench's (C0 torch, C1 jax, C2 tf)."""
    fig, (ax, diff) = plt.subplots(1, 2, figsize=(11.0, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    base = {e[0]: e[1] for e in runs[0]["evals"]}
    for r in runs + ([fp32] if fp32 else []):
        colour, label = f"C{FRAMEWORKS.index(framework_of(r))}", f"impl_{framework_of(r)}"
        steps, vals = zip(*[(e[0], e[1]) for e in r["evals"]], strict=True)
        if r is fp32:
            colour, label = "grey", f"{label}, float32 compute"
        else:
            ax.plot(range(1, len(r["losses"]) + 1), r["losses"], color=colour, linewidth=0.6, alpha=0.5,
                    label=f"{label} training")
            ax.plot(steps, vals, color=colour, marker="o", markersize=3, label=f"{label} validation ({vals[-1]:.3f})")
        diff.plot(steps, [v - base[s] for s, v in zip(steps, vals, strict=True)], color=colour, marker="o",
                  markersize=3, linestyle="--" if r is fp32 else "-", label=label)
    ax.axhline(runs[0]["unigram"]["cross_entropy"], color="grey", linestyle=":", linewidth=0.8,
               label="unigram on the held-out topics")
    c = runs[0]["config"]
    ax.set_xlabel("step")
    ax.set_ylabel("next-token cross entropy, nats")
    ax.set_title("training and validation loss", fontsize=9)
    ax.legend(fontsize=7)
    diff.set_xlabel("step")
    diff.set_ylabel("nats")
    diff.set_title(f"validation loss minus impl_{framework_of(runs[0])}'s", fontsize=9)
    diff.legend(fontsize=7)
    fig.suptitle(f"CPython's docs: d_model {c['d_model']}, {c['n_decoder_layers']} layers, context {c['max_len']}, "
                 f"{c['dtype']} compute, batch {runs[0]['batch']}, seed {runs[0]['seed']}, same weights and windows",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

if __name__ == "__main__":
    main()
