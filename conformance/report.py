"""The conformance report: per backend, each check's outcome and its worst error against its limit,
grouped by family, as a terminal table, JSON and Markdown.

    python conformance/report.py reports/*/conformance-*.json [--out DIR]   # combine per-backend reports

Errors are in ulps of the tensor's dtype at its RMS scale (``spec.tolerance``); a check's "worst" tensor
is the one using the largest share of its limit, under the max or the RMS criterion, whichever is tighter.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

FAMILIES = ("golden", "training", "properties", "errors", "weights")  # in this order; a new family after them
BACKENDS = ("reference", "torch", "jax", "tf")  # in this order, the reference first: the others are read against it
UNIT = {"bfloat16": "bf16 ulps", "float32": "fp32 ulps", "update": "lr steps"}  # "update": weights after Adam
COLUMNS = ("result", "worst error / limit (% of limit)", "worst tensor", "÷ faithful")  # the last two: wide only
LAYOUTS = ((False, True), (False, False), (True, True), (True, False))  # (stacked, wide), the most readable first
NAME_WIDTH = 48  # a check name may fold past this many characters; the other cells should fit unwrapped
MESSAGE_WIDTH = 36  # the terminal cuts why a check did not pass short: pytest's output and the Markdown have it all
# A check's outcomes, the worst of its phases' last: "not supported" is a capability the backend says it lacks
# (conformance.adapters.base.CAPABILITIES), counted apart from the checks that ran.
OUTCOMES = ("passed", "skipped", "not supported", "failed")
STYLE = {"passed": "green", "failed": "bold red", "skipped": "yellow", "not supported": "cyan"}
# The legend; its second part only where the "÷ faithful" column is shown.
LEGEND = ("worst error / limit: the judged tensor nearest its limit (max or RMS criterion), in ulps of its dtype "
          "at the tensor's RMS scale (weights after Adam steps: in learning-rate steps); over 100% of the limit "
          "fails.", " ÷ faithful: that tensor's max error over the faithful reference's.")


def family_of(check: str, module: str) -> str:
    """``training`` for the golden training cases, ``golden`` for the other golden checks, otherwise the test
    module's name: ``test_errors.py`` -> ``errors``."""
    if check.startswith("golden_train"):
        return "training"
    return "golden" if check.startswith("golden_") else Path(module).stem.removeprefix("test_")


def _use(t: dict) -> dict:
    """A tensor's error as a share of its limit under its tighter criterion; above 1 fails."""
    crits = [("max", t["max_eps"], t["allowed_eps"])]
    if t.get("allowed_rms_eps") is not None:
        crits.append(("rms", t["rms_eps"], t["allowed_rms_eps"]))
    # a zero limit (the RMS bound has no floor) admits only a zero error
    used, criterion, err, limit = max((e / lim if lim else math.inf if e else 0.0, c, e, lim) for c, e, lim in crits)
    return {"used": used, "criterion": criterion, "err": err, "limit": limit}


def worst(checks: dict[str, dict]) -> dict | None:
    """The judged tensor of these checks that uses the largest share of its limit, None if none was judged."""
    judged = [{"check": c, **t, **_use(t)} for c, e in checks.items() for t in e["tensors"]]
    return max(judged, key=lambda t: t["used"], default=None)


def _cell(checks: dict[str, dict], family: bool) -> dict:
    """One backend's cells for a family line (``family``) or for a single check."""
    n = Counter(e["outcome"] for e in checks.values())
    outcome = max(n, key=OUTCOMES.index)
    w = worst(checks)
    result = f"{n['passed']}/{len(checks)} passed" + f", {n['not supported']} not supported" * bool(n["not supported"])
    return {"outcome": outcome, "result": result if family else outcome,
            "error": f"{w['criterion']} {w['err']:.3g} / {w['limit']:.3g} {UNIT[w['unit']]} "
                     f"({100 * w['used']:.0f}%)" if w else "",
            "message": "" if family else next(iter(checks.values()))["message"],
            "tensor": ((f"{w['check']}: " if family else "") + w["tensor"]) if w else "",
            "ratio": f"{w['ratio']:.3g}" if w else ""}


def rows(reports: list[dict]) -> list[tuple[str, bool, list[dict | None]]]:
    """(label, is a family line, each backend's cells or None where it lacks the check). A family whose checks
    all passed where they ran is one line (a backend that does not collect some of them shows fewer in its count);
    otherwise its line is followed by one line per check."""
    found = {e["family"] for r in reports for e in r["checks"].values()}
    out = []
    for fam in sorted(found, key=lambda f: (FAMILIES.index(f) if f in FAMILIES else len(FAMILIES), f)):
        per = [{c: e for c, e in r["checks"].items() if e["family"] == fam} for r in reports]
        out.append((fam, True, [_cell(p, family=True) if p else None for p in per]))
        names = set().union(*per)
        if any(e["outcome"] != "passed" for p in per for e in p.values()):
            out += [(c, False, [_cell({c: p[c]}, family=False) if c in p else None for p in per])
                    for c in sorted(names)]
    return out


def _names(wide: bool) -> tuple[str, ...]:
    return COLUMNS if wide else COLUMNS[:2]


def _texts(c: dict | None, wide: bool, clip: bool) -> list[Text]:
    """One backend's cells; a check judged no tensor shows why it did not pass, cut short if ``clip``."""
    if c is None:
        return [Text("-")] + [Text() for _ in _names(wide)[1:]]
    why = c["message"][:MESSAGE_WIDTH - 1] + "…" if clip and len(c["message"]) > MESSAGE_WIDTH else c["message"]
    out = [Text(c["result"], STYLE[c["outcome"]]), Text(c["error"]) if c["error"] else Text(why, "italic")]
    return out + [Text(c["tensor"]), Text(c["ratio"])] * wide


def _label(report: dict) -> str:
    return report["backend"] + " (partial)" * report["partial"]


def summary_line(report: dict) -> str:
    n = Counter(e["outcome"] for e in report["checks"].values())
    described = f" ({report['describe']})" if report["describe"] else ""
    line = (f"{report['backend']}{described}: {n['passed']} passed, {n['failed']} failed, {n['skipped']} skipped"
            + f", {n['not supported']} not supported" * bool(n["not supported"]) + f" in {report['duration_s']:.1f} s")
    if report["partial"]:
        line += (f" — PARTIAL RUN ({len(report['checks'])} of {report['collected']} collected checks; "
                 f"filter: {report['filter']})")
    return line


def build_table(reports: list[dict], stacked: bool, wide: bool) -> Table:
    """The grouped table: the backends' columns side by side, or (``stacked``) one line per backend under each
    check, which fits any number of backends into 120 columns; ``wide`` adds the secondary columns."""
    table = Table(title="Conformance report", caption="".join(LEGEND[:1 + wide]), caption_justify="left")
    table.add_column("check", overflow="fold")
    names = _names(wide)
    if stacked:
        table.add_column("backend")
    heads = names if stacked else [f"{_label(r) if i == 0 else ''}\n{n}"  # the backend over its first column
                                   for r in reports for i, n in enumerate(names)]
    for h in heads:
        table.add_column(Text(h), overflow="fold", justify="right" if h.endswith("faithful") else "left")
    for label, family, cells in rows(reports):
        if family and table.rows:
            table.add_section()
        name = Text(label, "bold") if family else Text("  " + label)
        if stacked:
            for i, (r, c) in enumerate(zip(reports, cells, strict=True)):
                table.add_row(name if i == 0 else "", _label(r), *_texts(c, wide, clip=True))
        else:
            table.add_row(name, *(t for c in cells for t in _texts(c, wide, clip=True)))
    return table


def to_markdown(reports: list[dict]) -> str:
    """One line per backend under each check (as ``build_table(stacked=True, wide=True)``): a Markdown table
    with several backends' columns side by side would be too wide to read."""
    lines = ["| check | backend | " + " | ".join(COLUMNS) + " |", "|" + "---|" * (len(COLUMNS) + 2)]
    for label, family, cells in rows(reports):
        for i, (r, c) in enumerate(zip(reports, cells, strict=True)):
            name = "" if i else f"**{label}**" if family else f"`{label}`"
            row = [name, _label(r)] + [t.plain for t in _texts(c, wide=True, clip=False)]
            lines.append("| " + " | ".join(x.replace("|", "\\|") for x in row) + " |")
    summary = "\n".join(f"- {summary_line(r)}" for r in reports)
    return f"# Conformance report\n\n{summary}\n\n{''.join(LEGEND)}\n\n" + "\n".join(lines) + "\n"


def write(reports: list[dict], out_dir: Path, stem: str) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    j, m = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    j.write_text(json.dumps(reports if len(reports) > 1 else reports[0], indent=1, sort_keys=True))
    m.write_text(to_markdown(reports))
    return j, m


def show(reports: list[dict]) -> None:
    console = Console()
    # The first layout (the most readable first) that fits the terminal.
    slack = max(0, max(len(label) + 2 for label, _, _ in rows(reports)) - NAME_WIDTH)
    unwrapped = console.options.update_width(10**4)
    for stacked, wide in LAYOUTS:
        table = build_table(reports, stacked, wide)
        if console.measure(table, options=unwrapped).maximum - slack <= console.width:
            break
    verdict = [Text(summary_line(r), "bold yellow" if r["partial"] else "") for r in reports]
    for line in verdict:  # the verdict first, and again under the table
        console.print(line)
    console.print(table)
    for line in verdict:
        console.print(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Combine per-backend conformance reports.")
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="also write combined JSON and Markdown here")
    args = parser.parse_args(argv)
    reports = sorted((json.loads(f.read_text()) for f in args.files),
                     key=lambda r: (BACKENDS.index(r["backend"]) if r["backend"] in BACKENDS else len(BACKENDS),
                                    r["backend"]))
    show(reports)
    if args.out:
        write(reports, args.out, "conformance-combined")
    failed = any(e["outcome"] == "failed" for r in reports for e in r["checks"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
