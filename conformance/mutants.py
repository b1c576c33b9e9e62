"""Mutation test: proof that the conformance suite can fail.

Each mutant replaces a function or method of ``spec.reference`` (its ``layers``
and ``model``), ``spec.search`` or ``spec.training`` with a plausible bug:
eleven break the paper's mathematics; five only the numerics contract (two round
where the contract says not to, proving the error bounds tight enough to see it;
two skip or coarsen a rounding it asks for, the residual sum kept in fp32, which
only the agreement bound sees, and LayerNorm statistics in bf16, which a large
mean also shows; a softmax
without its max subtraction, which only scores that overflow fp32 exp see); six
break decoding (the search, the length penalty, the KV cache's positions, the
special tokens, a greedy search that writes on after a row's EOS); and seven
break training (label smoothing off, padding counted in the loss, Adam's beta2
0.999, no warmup, dropout left on in evaluation, dropout applied after the
residual sum, which only the dropout check sees, weight gradients rounded to
bf16 in mixed precision). Six more break the decoder-only model and sampling
(``conformance.mutations_lm``): a causal mask that shows the next position, a
missing final LayerNorm, temperature applied after the softmax, top-p keeping
one token too few, top-k ties to the higher id, and uniforms that are not the
spec's. Seven break the options of published checkpoints
(``conformance.mutations_options``): Marian's sin-then-cos table laid out as the
paper's, GELU for ReLU, GELU's tanh approximation for its erf form, attention
biases or the logits bias dropped, learned positions that forget the cache's
offset, and the embedding scaled where the config says not to.
The suite runs against the mutated reference backend (``--mutant NAME``), in a
subprocess per mutant, and must fail; the table names the checks that caught it.

    python -m conformance.mutants [--only NAME ...] [--report-dir DIR]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from conformance.mutations import MUTANTS as PAPER_MUTANTS
from conformance.mutations import resolve
from conformance.mutations_lm import LM_MUTANTS
from conformance.mutations_options import OPTION_MUTANTS

MUTANTS = {**PAPER_MUTANTS, **LM_MUTANTS, **OPTION_MUTANTS}


def apply(name: str) -> None:
    """Replace the function or method that mutant ``name`` targets, for this process."""
    if name not in MUTANTS:
        raise ValueError(f"unknown mutant {name!r}; choose from {sorted(MUTANTS)}")
    patches = MUTANTS[name] if isinstance(MUTANTS[name][0], tuple) else (MUTANTS[name],)
    for target, fn in patches:
        owner, _, attr = target.rpartition(".")
        _check_signature(name, resolve(target), fn)
        setattr(resolve(owner), attr, fn)


def _check_signature(name, original, mutant) -> None:
    # A mutant that cannot be called as the original is "caught" by a TypeError, not by the suite.
    params = inspect.signature(original).parameters.values()
    positional = [None] * sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    keywords = {p.name: None for p in params if p.kind is p.KEYWORD_ONLY}
    try:
        inspect.signature(mutant).bind(*positional, **keywords)
    except TypeError as e:
        raise ValueError(f"mutant {name!r} does not take the arguments of {original.__qualname__}: {e}") from None


def run(name: str, report_dir: Path) -> list[str]:
    """Run the suite against mutant ``name``; the names of the checks that failed."""
    subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "conformance", "--backend", "reference",
                    "--mutant", name, "--report-dir", str(report_dir), "-q", "-p", "no:cacheprovider"],
                   capture_output=True, text=True, check=False)
    report = report_dir / f"conformance-reference+{name}.json"
    if not report.exists():
        raise RuntimeError(f"mutant {name}: the suite wrote no report")
    checks = json.loads(report.read_text())["checks"]
    return sorted(c for c, e in checks.items() if e["outcome"] == "failed")


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=sorted(MUTANTS))
    parser.add_argument("--report-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    report_dir = args.report_dir or Path(tempfile.mkdtemp(prefix="mutants-"))
    table = Table(title="Mutants of the reference: the checks that caught each")
    table.add_column("mutant")
    table.add_column("caught")
    table.add_column("failed checks")
    survived = []
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # one suite process per mutant
        results = dict(zip(args.only, pool.map(lambda n: run(n, report_dir), args.only), strict=True))
    for name, failed in results.items():
        if not failed:
            survived.append(name)
        shown = ", ".join(failed[:6]) + (f", ... ({len(failed)} in all)" if len(failed) > 6 else "")
        table.add_row(name, "[green]yes[/]" if failed else "[bold red]NO[/]", escape(shown))
    Console(width=200).print(table)
    print(f"{len(args.only) - len(survived)} of {len(args.only)} mutants caught" +
          (f"; survived: {', '.join(survived)}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
