"""Mutation test: proof that the conformance suite can fail.

Each mutant replaces a function or method of ``spec.reference`` (its ``layers`` and ``model``), ``spec.search`` or
``spec.training`` with a plausible bug: eleven break the paper's mathematics; five only the numerics contract (two
round where the contract says not to, proving the error bounds tight enough to see it; two skip or coarsen a
rounding it asks for, the residual sum kept in fp32, which only the agreement bound sees, and LayerNorm statistics
in bf16, which a large mean also shows; a softmax without its max subtraction, which only scores that overflow fp32
exp see); six break decoding (the search, the length penalty, the KV cache's positions, the special tokens, a greedy
search that writes on after a row's EOS); and eight break training (``conformance.mutations_training``: label
smoothing off, padding counted in the loss, Adam's beta2 0.999, no warmup, dropout left on in evaluation, dropout
applied after the residual sum, which only the dropout check sees, weight gradients rounded to bf16 in mixed
precision, and one LayerNorm scale's gradient rounded so). Six more break the decoder-only model and sampling
(``conformance.mutations_lm``): a causal mask that shows the next position, a missing final LayerNorm, temperature
applied after the softmax, top-p keeping one token too few, top-k ties to the higher id, and uniforms that are not
the spec's. Seven break the options of published checkpoints (``conformance.mutations_options``): Marian's
sin-then-cos table laid out as the paper's, GELU for ReLU, GELU's tanh approximation for its erf form, attention
biases or the logits bias dropped, learned positions that forget the cache's offset, and the embedding scaled where
the config says not to. Three compute LayerNorm's statistics otherwise than rule 6's two fp32 passes
(``conformance.mutations_norm``): a one-pass variance E[x^2] - E[x]^2, the second moment taken as the variance, and
epsilon added outside the square root.

The suite runs against the mutated reference backend (``--mutant NAME``), in a subprocess per mutant, after a run
against the unmutated reference (the baseline). A mutant is caught only by a check whose own assertion fails and
that passed in the baseline: an error or a crash is reported apart, never as a catch, and the spec-drift guard (the
live oracle no longer gives a stored case) does not count. The table names the checks that caught each; the run
fails if a mutant is not caught or the baseline fails a check.

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
from conformance.mutations_norm import NORM_MUTANTS
from conformance.mutations_options import OPTION_MUTANTS
from conformance.mutations_training import TRAINING_MUTANTS

MUTANTS = {**PAPER_MUTANTS, **TRAINING_MUTANTS, **LM_MUTANTS, **OPTION_MUTANTS, **NORM_MUTANTS}
DRIFT_GUARD = "the spec no longer gives the case"  # test_golden_train's message when the live oracle left the case


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


def run(name: str | None, report_dir: Path) -> dict[str, dict]:
    """Run the suite against mutant ``name`` (None: the unmutated reference); each check's outcome as
    ``conformance.mutants_plugin`` records it, or a single "error" entry, the suite's own, when it recorded none."""
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "conformance", "--backend", "reference", "-p",
           "conformance.mutants_plugin", "--report-dir", str(report_dir), "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(cmd + ["--mutant", name] * bool(name), capture_output=True, text=True, check=False)
    path = report_dir / f"outcomes-reference{f'+{name}' if name else ''}.json"
    checks = json.loads(path.read_text()) if path.exists() else {}
    if not checks:  # a crash, or a suite that did not start (the mutant failed to apply)
        last = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
        return {"suite": {"outcome": "error", "message": f"exit status {proc.returncode}: {last}"}}
    return checks


def verdict(baseline: dict[str, dict], checks: dict[str, dict]) -> tuple[list[str], list[str], list[str]]:
    """(catches, drift, errors) of a mutant's run: the checks whose own assertion failed and that passed on the
    unmutated reference, the spec-drift guard apart (it fails when the live oracle moved, not the backend); and
    the checks that failed with any other exception, never a catch."""
    passed = {c for c, e in baseline.items() if e["outcome"] == "passed"}
    asserted = sorted(c for c, e in checks.items() if e["outcome"] == "assertion" and c in passed)
    drift = [c for c in asserted if DRIFT_GUARD in checks[c]["message"]]
    errors = sorted(c for c, e in checks.items() if e["outcome"] == "error")
    return [c for c in asserted if c not in drift], drift, errors


def _shown(names: list[str], most: int = 6) -> str:
    return ", ".join(names[:most]) + (f", ... ({len(names)} in all)" if len(names) > most else "")


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=sorted(MUTANTS))
    parser.add_argument("--report-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.only) - set(MUTANTS))
    if unknown:
        parser.error(f"unknown mutants {unknown}; choose from {sorted(MUTANTS)}")
    report_dir = args.report_dir or Path(tempfile.mkdtemp(prefix="mutants-"))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # the baseline first, then one per mutant
        runs = list(pool.map(lambda n: run(n, report_dir), [None, *args.only]))
    baseline, results = runs[0], dict(zip(args.only, runs[1:], strict=True))
    broken = sorted(c for c, e in baseline.items() if e["outcome"] in ("assertion", "error"))
    table = Table(title="Mutants of the reference: the checks whose assertion caught each")
    for column in ("mutant", "caught", "caught by (failed assertions)", "errors (not catches)"):
        table.add_column(column)
    survived = []
    for name, checks in results.items():
        catches, drift, errors = verdict(baseline, checks)
        if not catches:
            survived.append(name)
        caught = "[green]yes[/]" if catches else f"[bold red]NO{': drift guard only' * bool(drift)}[/]"
        table.add_row(name, caught, escape(_shown(catches or [f"{c} (drift guard)" for c in drift])),
                      escape(_shown(errors)))
    Console(width=200).print(table)
    print(f"baseline (the unmutated reference): {len(baseline)} checks, " +
          (f"FAILED: {', '.join(broken)}" if broken else "none failed"))
    print(f"{len(args.only) - len(survived)} of {len(args.only)} mutants caught by a failed assertion" +
          (f"; not caught: {', '.join(survived)}" if survived else ""))
    return 1 if survived or broken else 0


if __name__ == "__main__":
    sys.exit(main())
