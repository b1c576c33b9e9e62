"""The translation demo's report: a Markdown table, ten example translations and a plot of dev BLEU against
training minutes, from ``translate-demo.json`` (``tools.translate_demo``)."""

from __future__ import annotations

from pathlib import Path

from bench.common import machine
from spec.api import BACKENDS
from text import data

NAMES = {**{b: f"impl_{b}" for b in BACKENDS}, "peer": "torch.nn.Transformer (peer)"}


def _machine_line() -> str:
    """This machine in one line for the report and the plot: CPU, cores, Python, date (``bench.common.machine``)."""
    m = machine()
    return f"{m['cpu']} ({' '.join(m['simd'])}), {m['cores']} cores, Python {m['python']}, {m['date']}"


def _label(name: str) -> str:
    """A system's name in the table; the peer's with its precision, bf16 autocast only where the CPU has bf16 dot
    products (``tools.peer_torch.native_bf16``)."""
    if name != "peer":
        return NAMES.get(name, name)
    native = {"avx512_bf16", "amx_bf16"} & set(machine()["simd"])
    return f"{NAMES[name]}, {'bf16 autocast' if native else 'fp32 (no bf16 dot products on this CPU)'}"


def table(result: dict) -> str:
    """Test BLEU of each system beside the baselines, tokens/s and steps; the batch shapes trained (one XLA program
    each in jax and tf) and the share of computed positions that were padding, where the run recorded them."""
    base = result["corpus"]["baselines"]["test"]
    lines = ["| system | steps | tokens/s (1 core, 1 thread) | batch shapes | padding | final dev loss | "
             "test BLEU, last checkpoint | test BLEU, averaged | length ratio (averaged) |", "|---" * 9 + "|"]
    for name, runs in result["runs"].items():
        last, test = runs[-1], result["test"][name]
        shapes, padding = last.get("shapes", ""), f"{last['padding']:.1%}" if "padding" in last else ""
        lines.append(f"| {_label(name)} | {last['step']:,} | {last['tokens_per_s']:,.0f} | {shapes} | {padding} | "
                     f"{last['dev_loss']:.3f} | {test['last']['bleu']:.2f} | {test['averaged']['bleu']:.2f} | "
                     f"{test['averaged']['length_ratio']:.2f} |")
    lines.append(f"| copy the source | | | | | | {base['copy_bleu']:.2f} | | {base['copy_length_ratio']:.2f} |")
    lines.append(f"| translation memory | | | | | | {base['memory_bleu']:.2f} | | {base['memory_length_ratio']:.2f} |")
    signature = next(iter(result["test"].values()))["averaged"]["signature"]
    return "\n".join(lines) + f"\n\n{process_line(result)}sacreBLEU signature: `{signature}`\n"


def process_line(result: dict) -> str:
    """How the training processes ran, as their runs recorded it: intra-op threads and glibc malloc's settings
    (``text.malloc``)."""
    process = result.get("process", {})
    kept = {name: p.get("malloc") for name, p in process.items()}
    if not kept:
        return ""
    if len({str(v) for v in kept.values()}) > 1:
        each = "; ".join(f"{NAMES.get(n, n)} {v or 'defaults'}" for n, v in kept.items())
        return f"The training processes' malloc settings differ: {each}.\n\n"
    settings = next(iter(kept.values()))
    what = ", ".join(f"{k} {v:,}" for k, v in settings.items()) if settings else "its defaults"
    threads = ", ".join(sorted({str(p.get("threads")) for p in process.values()}))
    return f"Every training process: {threads} intra-op thread(s), glibc's malloc with {what} (`text.malloc`).\n\n"


def examples(result: dict, prepared: data.Prepared, out: Path, n: int = 10) -> str:
    """``n`` test sentences spread over the set: source, reference and each system's averaged translation."""
    hyps = {name: (out / "runs" / name / "test-averaged.de").read_text().splitlines() for name in result["runs"]}
    count = min(len(h) for h in hyps.values())
    rows = []
    for i in range(0, count, max(1, count // n))[:n]:
        rows.append(f"- **en** {prepared.test.sources[i]}\n  - **reference** {prepared.test.targets[i]}")
        rows += [f"  - **{NAMES.get(name, name)}** {h[i]}" for name, h in hyps.items()]
    return "\n".join(rows) + "\n"


def plot(result: dict, path: Path) -> None:
    """Dev BLEU (greedy, on the first dev sentences) against training minutes, one line per system, the dev
    baselines as horizontal lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, runs in result["runs"].items():
        ax.plot([r["train_s"] / 60 for r in runs], [r["dev_bleu_greedy"] for r in runs], marker="o", ms=3,
                label=NAMES.get(name, name))
    base = result["corpus"]["baselines"]["dev"]
    ax.axhline(base["copy_bleu"], color="grey", ls=":", label="copy the source (whole dev set)")
    ax.axhline(base["memory_bleu"], color="grey", ls="--", label="translation memory (whole dev set)")
    ax.set_xlabel("training minutes (1 core, 1 thread each)")
    ax.set_ylabel("dev BLEU, greedy")
    ax.set_title(f"En→De, gettext catalogs: dev BLEU against training time\n{_machine_line()}", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(result: dict, prepared: data.Prepared, out: Path, doc: Path | None = None) -> None:
    """``translate-demo.md`` and ``translate-demo.png`` in ``out``; with ``doc`` (docs/text.md), its section between
    the ``translate:begin`` and ``translate:end`` markers rewritten from the same figures (images from
    docs/translate/)."""
    plot(result, out / "translate-demo.png")
    c, same = result["corpus"], result.get("same_checkpoint")
    removed = ", ".join(f"{k} {v:,}" for k, v in c["cleaning"].items() if k not in ("whitespace", "kept"))
    skipped = sum(c["skipped"].values())
    parts = [f"# Translation demo: En→De, {result['minutes']:g} minutes of training per system\n",
             f"Machine: {_machine_line()}. Corpus: {c['read']:,} catalog pairs read ({skipped} strings outside their "
             f"catalog's charset left out); whitespace normalised in {c['cleaning']['whitespace']:,}; removed: "
             f"{removed}; kept {c['cleaning']['kept']:,}; split train {c['split']['train']:,}, dev "
             f"{c['split']['dev']:,}, test {c['split']['test']:,} by near-duplicate group; near-duplicate rate "
             f"(a training source ≥ 90% similar) dev "
             f"{c['baselines']['dev']['near_duplicate_rate_90']:.1%}, test "
             f"{c['baselines']['test']['near_duplicate_rate_90']:.1%}.\n", table(result)]
    if same and "test_bleu" in same:
        figures = ", ".join(f"{b} {bleu:.2f}" for b, bleu in same["test_bleu"].items())
        parts.append(f"Test BLEU (beam 4) of one checkpoint ({same['checkpoint']}) in each backend: {figures}.\n")
    if same:
        parts.append(agreement_text(same))
    parts += ["![dev BLEU against minutes](translate-demo.png)\n", "### Ten test translations (averaged checkpoints)\n",
              examples(result, prepared, out)]
    (out / "translate-demo.md").write_text("\n".join(parts))
    if doc is not None:
        body = "\n".join(parts[1:]).replace("](translate-demo.png)", "](translate/translate-demo.png)")
        text = doc.read_text()
        head, rest = text.split("<!-- translate:begin -->", 1)
        doc.write_text(f"{head}<!-- translate:begin -->\n\n{body}\n<!-- translate:end -->"
                          f"{rest.split('<!-- translate:end -->', 1)[1]}")


def agreement_text(same: dict) -> str:
    """The same-checkpoint paragraph: identical texts, token ids equal to the reference's, and the decisive
    sentences (``spec.decisions``) per backend, each of which must equal the reference."""
    def counts(d: dict) -> str:
        return ", ".join(f"{k} {v}" for k, v in d.items())
    differing = {k: len(v) for k, v in same["decisive_differing"].items()}
    return (f"One checkpoint ({same['checkpoint']}) translated greedily by the three backends, first "
            f"{same['sentences']} test sentences: identical text in all three for {same['identical_all_three']}; "
            f"token ids equal to the reference's exact decoding: {counts(same['equal_to_reference'])}. Judged per "
            f"decision (`spec.decisions`: each emitted token's margin over the runner-up above twice the logits "
            f"tolerance at its position; median tolerance {same['median_tolerance']:.3g}, median margin "
            f"{same['median_margin']:.3g}, {same['decisive_decisions']:.1%} of decisions decisive): "
            f"{same['decisive']} decisive sentences, which every conformant backend must decode as the reference; "
            f"decisive sentences that differ: {counts(differing)}.\n")
