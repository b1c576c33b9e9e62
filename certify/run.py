"""Run the conformance suite against every adapter (``certify.adapters.ADAPTERS``), one pytest process each, one
after another, and write the table (``certify.table``)::

    python -m certify [--only nn_transformer ...] [--out docs/certified.md] [--report-dir DIR] [-- PYTEST ARGS]
    python -m certify --table-only --report-dir DIR      # the table again from the reports a run kept in DIR

Each process runs ``pytest --pyargs conformance --backend certify.adapters.<name> --report-dir DIR`` and leaves
``conformance-certify.adapters.<name>[-partial].json`` there; pytest arguments after ``--`` (``-k``) go to each.
``OMP_NUM_THREADS`` defaults to 1 (the CPU may be shared; set it to use more threads).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from certify import table
from certify.adapters import ADAPTERS

DOC = Path(__file__).resolve().parent.parent / "docs" / "certified.md"


def backend_of(adapter: str) -> str:
    return f"certify.adapters.{adapter}"


def run_suite(adapter: str, report_dir: Path, pytest_args: list[str]) -> dict:
    """One adapter's conformance report (the JSON the suite wrote), running the suite in a subprocess."""
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "conformance", "--backend", backend_of(adapter),
           "--report-dir", str(report_dir), "-q", "-p", "no:cacheprovider", *pytest_args]
    env = {"OMP_NUM_THREADS": "1", **os.environ}
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, env=env, check=False)  # a failing check is an outcome, read from the report
    return read_report(adapter, report_dir)


def read_report(adapter: str, report_dir: Path) -> dict:
    """The adapter's report in ``report_dir``: the full run's, else a partial one's."""
    stem = f"conformance-{backend_of(adapter)}"
    found = [p for p in (report_dir / f"{stem}.json", report_dir / f"{stem}-partial.json") if p.exists()]
    if not found:
        raise RuntimeError(f"{adapter}: the suite wrote no report in {report_dir} (see its output above)")
    return json.loads(found[0].read_text())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, pytest_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="python -m certify", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=ADAPTERS, default=list(ADAPTERS), help="these adapters")
    parser.add_argument("--out", type=Path, default=DOC, help=f"the Markdown table (default {DOC})")
    parser.add_argument("--report-dir", type=Path, default=None, help="keep the suite's reports here")
    parser.add_argument("--table-only", action="store_true", help="no runs: the table of the reports in --report-dir")
    args = parser.parse_args(ours)
    if args.table_only and not args.report_dir:
        parser.error("--table-only reads the reports of --report-dir")
    with tempfile.TemporaryDirectory() as tmp:
        report_dir = args.report_dir or Path(tmp)
        reports = {a: read_report(a, report_dir) if args.table_only else run_suite(a, report_dir, pytest_args)
                   for a in args.only}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table.markdown(reports))
    print(f"wrote {args.out}")
    return 0
