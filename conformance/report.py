"""The conformance report: backend x check, pass/fail and errors, as a table, JSON and Markdown.

    python -m conformance.report reports/conformance-*.json   # combine per-backend reports
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

COLUMNS = ("max abs", "max ulps", "ratio")


def row_of(entry: dict) -> dict:
    """A check's worst tensor: max abs error, max error in ulps (eps at the tensor's RMS
    scale, ``spec.tolerance``) and the ratio of its max error to the faithful reference's."""
    tensors = entry.get("tensors", [])
    worst = lambda key: max((t[key] for t in tensors), default=None)  # noqa: E731
    return {"outcome": entry["outcome"], "max abs": worst("max_abs"), "max ulps": worst("max_eps"),
            "ratio": worst("ratio")}


def _fmt(x: float | None) -> str:
    if x is None:
        return ""
    if math.isinf(x):
        return "inf"
    return f"{x:.3g}"


def build_table(reports: list[dict]) -> Table:
    backends = [r["backend"] for r in reports]
    table = Table(title="Conformance: " + ", ".join(f"{r['backend']} ({r['describe']})" for r in reports))
    table.add_column("check")
    for b in backends:
        table.add_column(b)
        for col in COLUMNS:
            table.add_column(f"{b}\n{col}", justify="right")
    checks = sorted({c for r in reports for c in r["checks"]})
    for check in checks:
        cells = [escape(check)]
        for r in reports:
            e = r["checks"].get(check)
            if e is None:
                cells += ["-"] + [""] * len(COLUMNS)
                continue
            row = row_of(e)
            style = {"passed": "green", "failed": "bold red", "skipped": "yellow"}.get(row["outcome"], "")
            cells += [f"[{style}]{row['outcome']}[/]"] + [_fmt(row[c]) for c in COLUMNS]
        table.add_row(*cells)
    return table


def summary_line(report: dict) -> str:
    counts = {}
    for e in report["checks"].values():
        counts[e["outcome"]] = counts.get(e["outcome"], 0) + 1
    return f"{report['backend']}: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))


def to_markdown(reports: list[dict]) -> str:
    head = ["check"] + [f"{r['backend']} {c}" for r in reports for c in ("result",) + COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for check in sorted({c for r in reports for c in r["checks"]}):
        cells = [check]
        for r in reports:
            e = r["checks"].get(check)
            row = row_of(e) if e else {"outcome": "-"}
            cells += [row["outcome"]] + [_fmt(row.get(c)) for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    described = "\n".join(f"- {r['backend']}: {r['describe']}" for r in reports)
    return f"# Conformance report\n\n{described}\n\n" + "\n".join(lines) + "\n"


def write(reports: list[dict], out_dir: Path, stem: str) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    j, m = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    j.write_text(json.dumps(reports if len(reports) > 1 else reports[0], indent=1, sort_keys=True))
    m.write_text(to_markdown(reports))
    return j, m


def show(reports: list[dict]) -> None:
    console = Console(width=max(160, 40 + 45 * len(reports)))
    console.print(build_table(reports))
    for r in reports:
        console.print(summary_line(r))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Combine per-backend conformance reports.")
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="also write combined JSON and Markdown here")
    args = parser.parse_args(argv)
    reports = [json.loads(f.read_text()) for f in args.files]
    show(reports)
    if args.out:
        write(reports, args.out, "conformance-combined")
    failed = any(e["outcome"] == "failed" for r in reports for e in r["checks"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
