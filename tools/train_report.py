"""The training demo's runs (``tools.train_demo``, one JSON per framework) merged: one PNG of the loss curves over
steps beside the held-out accuracy, one JSON of the final accuracies and times, and a Markdown table on stdout; after
a full run (every framework) both files are copied to ``docs/train_demo/``, which docs/training.md shows.

    python -m tools.train_report reports/.../train_demo/*.json --out reports/.../train_demo/
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display
import matplotlib.pyplot as plt  # noqa: E402

# spec.api.BACKENDS, written out: this report and tools.lm_report run where only matplotlib is installed.
FRAMEWORKS = ("torch", "jax", "tf")
RESULTS = Path(__file__).resolve().parents[1] / "docs" / "train_demo"  # the committed copy docs/training.md shows
PNG, JSON = "train-demo.png", "train-demo.json"
SUMMARY = ("accuracy", "steps", "batch", "seed", "train_s", "wall_s", "target", "target_step", "target_s", "version")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    runs = sorted((json.loads(f.read_text()) for f in args.files), key=lambda r: FRAMEWORKS.index(framework_of(r)))
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {framework_of(r): {k: r[k] for k in SUMMARY} for r in runs}
    summary["config"], summary["train_config"] = runs[0]["config"], runs[0]["train_config"]
    (args.out / JSON).write_text(json.dumps(summary, indent=1))
    chart(runs, args.out / PNG)
    print(table(runs))
    if {framework_of(r) for r in runs} == set(FRAMEWORKS):
        RESULTS.mkdir(exist_ok=True)
        for name in (PNG, JSON):
            shutil.copy(args.out / name, RESULTS / name)
        print(f"copied {PNG} and {JSON} to {RESULTS}")
    else:
        print(f"{RESULTS} left as it is: only a run of every framework replaces it")


def framework_of(run: dict[str, Any]) -> str:
    """The framework of a demo's record: "torch" for ``{"backend": "impl_torch", ...}``."""
    return run["backend"].removeprefix("impl_")


def table(runs: list[dict[str, Any]]) -> str:
    """Markdown: per framework, the first evaluation at the target, the final accuracy and the times."""
    rows = ["| backend | steps × batch | reached 99% at step | training s to 99% | final exact match | training s "
            "| wall s |", "|---|---|---|---|---|---|---|"]
    for r in runs:
        to_target = "—" if r["target_s"] is None else f"{r['target_s']:.0f}"
        rows.append(f"| impl_{framework_of(r)} | {r['steps']} × {r['batch']} | {r['target_step'] or '—'} | "
                    f"{to_target} | {r['accuracy']:.1%} | "
                    f"{r['train_s']:.0f} | {r['wall_s']:.0f} |")
    return "\n".join(rows)


def chart(runs: list[dict[str, Any]], path: Path) -> Path:
    """One PNG: the training loss per step of every framework (left) and the held-out exact match of the averaged
    checkpoints at each evaluation (right); colours as the bench's charts (C0 torch, C1 jax, C2 tf)."""
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(10.0, 4.0))
    for r in runs:
        colour, label = f"C{FRAMEWORKS.index(framework_of(r))}", f"impl_{framework_of(r)}"
        loss_ax.plot(range(1, len(r["losses"]) + 1), r["losses"], color=colour, linewidth=0.8, alpha=0.8,
                     label=label)
        steps, acc = [e[0] for e in r["evals"]], [100 * e[1] for e in r["evals"]]
        acc_ax.plot(steps, acc, color=colour, marker="o", markersize=3, label=f"{label} ({r['accuracy']:.1%})")
    c, first = runs[0]["config"], runs[0]
    loss_ax.set_yscale("log")
    loss_ax.set_xlabel("step")
    loss_ax.set_ylabel("label-smoothed loss (log scale)")
    loss_ax.set_title("training loss per step", fontsize=9)
    loss_ax.legend(fontsize=8)
    acc_ax.axhline(100 * first["target"], color="grey", linestyle=":", linewidth=0.8)
    acc_ax.set_xlabel("step")
    acc_ax.set_ylabel("held-out exact match, %")
    acc_ax.set_ylim(0, 101)
    acc_ax.set_title(f"held-out exact match, greedy, average of the last {first['average']} checkpoints", fontsize=9)
    acc_ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"Reversing random sequences of 8-16 tokens: d_model {c['d_model']}, {c['n_encoder_layers']}+"
                 f"{c['n_decoder_layers']} layers, {c['dtype']} compute, batch {first['batch']}, seed "
                 f"{first['seed']}, same weights and data", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    main()
