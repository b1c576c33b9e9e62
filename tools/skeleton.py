"""How far the NumPy reference and the three impls are from one skeleton: the same files, the same definitions,
in the same order.

    python -m tools.skeleton                                  # fails below --min-score 0.85 or --min-pair 0.75
    python -m tools.skeleton --min-score 0.5 --min-pair 0     # looser thresholds
    python -m tools.skeleton --table --names                  # the table even when it passes; unshared names
    python -m tools.skeleton --signatures                     # the shared definitions whose arguments differ

For every file name found in any impl (``impl_*/*.py``, not their tests), it lists the top-level functions and
classes and each class's methods (in source order, ``Class.method``) and compares the impls pairwise with difflib's
ratio over those name sequences (1.0 = the same names in the same order; two files without definitions score 1.0). A
file missing from an impl scores 0 for each pair it is in. The score is the mean over files and pairs;
``--min-pair`` bounds the lowest single (file, pair) ratio. The reference (``spec/reference/``) joins the comparison
for the files where it has the impls' role (``REFERENCE_FILES``: the products, the layers, the stacks, the model), not
for its package's functional entry points or the search, whose reference (``spec.search``) traces margins. It
reads names only: a map of drift, not a verdict on style. A file holding one framework's machinery only
(``PARTICULAR_FILES``, each with its reason) is shown, marked ``*``, but not scored. Exit status 1 when a threshold
is not met, with the table and what fell short.

Signatures: of the definitions that all three impls have (``file:Class.method``), those whose argument names
differ (in order, positional and keyword; ``PLUMBING`` aside: ``self``, a torch ``device``, ``native_bf16``,
``dtype``). ``--max-differ`` bounds their number (each one that stays is named, with its reason, in
docs/library.md's "Where the impls differ, and why").
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import itertools
import sys
from pathlib import Path

IMPLS = ("impl_torch", "impl_jax", "impl_tf")
REFERENCE = "spec/reference"
REFERENCE_FILES = ("numerics.py", "layers.py", "stacks.py", "model.py")
PARTICULAR_FILES = {  # one framework's machinery, no counterpart to score: shown, marked, not scored
    "programs.py": "impl_tf's XLA programs shared by the models of one config (jax.jit keeps its own cache; "
                   "torch runs eagerly)",
}
ROOT = Path(__file__).resolve().parents[1]
PLUMBING = {"self", "cls", "device", "native_bf16", "dtype"}  # framework plumbing, not part of a signature


@dataclasses.dataclass
class FileScore:
    """One file name: its definitions in each impl (None where the impl lacks the file), one ratio per pair."""
    name: str
    defs: dict[str, list[str] | None]
    pairs: dict[tuple[str, str], float]


def names(path: Path) -> list[str]:
    """The top-level function and class names of a Python file, each class followed by its ``Class.method``s."""
    out = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out.append(node.name)
        elif isinstance(node, ast.ClassDef):
            out.append(node.name)
            out += [f"{node.name}.{m.name}" for m in node.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)]
    return out


def arguments(path: Path) -> dict[str, list[str]]:
    """``{"Class.method" or "function": its argument names in order}`` of a Python file, top level and one class
    level down, ``PLUMBING`` left out."""
    out = {}
    for node in ast.parse(path.read_text()).body:
        members = [(f"{node.name}.", m) for m in node.body] if isinstance(node, ast.ClassDef) else [("", node)]
        for prefix, d in members:
            if isinstance(d, ast.FunctionDef | ast.AsyncFunctionDef):
                a = d.args
                out[prefix + d.name] = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in PLUMBING]
    return out


def differing_signatures(root: Path, impls: tuple[str, ...] = IMPLS) -> dict[str, dict[str, list[str]]]:
    """``{"file:definition": {impl: argument names}}`` for each definition every impl has whose argument names
    are not the same in all of them."""
    out = {}
    for f in sorted({p.name for impl in impls for p in (root / impl).glob("*.py")}):
        if not all((root / impl / f).exists() for impl in impls):
            continue
        args = {impl: arguments(root / impl / f) for impl in impls}
        for name in sorted(set.intersection(*(set(a) for a in args.values()))):
            sigs = {impl: args[impl][name] for impl in impls}
            if len({tuple(s) for s in sigs.values()}) > 1:
                out[f"{f}:{name}"] = sigs
    return out


def ratio(a: list[str] | None, b: list[str] | None) -> float:
    """difflib's ratio of two name sequences; 0 if either file is missing, 1 if both are empty."""
    if a is None or b is None:
        return 0.0
    if not a and not b:
        return 1.0
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def scores(root: Path, impls: tuple[str, ...] = IMPLS) -> list[FileScore]:
    """Every file name present in any impl under ``root``, sorted, with its definitions and pair ratios; for the
    ``REFERENCE_FILES`` the reference too, where ``root`` has it. ``PARTICULAR_FILES`` get no pairs (not scored)."""
    files = sorted({p.name for impl in impls for p in (root / impl).glob("*.py")})
    out = []
    for f in files:
        members = ((REFERENCE,) if f in REFERENCE_FILES and (root / REFERENCE).is_dir() else ()) + impls
        defs = {m: names(root / m / f) if (root / m / f).exists() else None for m in members}
        pairs = [] if f in PARTICULAR_FILES else itertools.combinations(members, 2)
        out.append(FileScore(f, defs, {(a, b): ratio(defs[a], defs[b]) for a, b in pairs}))
    return out


def mean_score(files: list[FileScore]) -> float:
    """The mean of every (file, pair) ratio; 0 when there is no file."""
    values = [r for f in files for r in f.pairs.values()]
    return sum(values) / len(values) if values else 0.0


def min_pair(files: list[FileScore]) -> float:
    """The lowest (file, pair) ratio; 1 when there is no file."""
    return min((r for f in files for r in f.pairs.values()), default=1.0)


def table(files: list[FileScore], show_names: bool = False) -> str:
    """One row per file: definitions per impl ('-' where missing) and the pair ratios; with ``show_names``, the
    definitions that not every impl holding the file has. ``PARTICULAR_FILES`` are marked ``*``, their reason below."""
    members = ((REFERENCE,) if any(REFERENCE in f.defs for f in files) else ()) + IMPLS
    pairs = list(itertools.combinations(members, 2))
    lines = [f"{'file':<14} {'defs ' + '/'.join(map(_short, members)):>22}  "
             + "  ".join(f"{_short(a) + '~' + _short(b):>9}" for a, b in pairs)]
    for f in files:
        counts = "/".join("." if m not in f.defs else "-" if f.defs[m] is None else str(len(f.defs[m]))
                          for m in members)
        mark = "*" if f.name in PARTICULAR_FILES else ""
        lines.append(f"{f.name + mark:<14} {counts:>22}  "
                     + "  ".join(f"{f.pairs[p]:9.2f}" if p in f.pairs else f"{'':9}" for p in pairs))
        if show_names:
            present = [set(d) for d in f.defs.values() if d is not None]
            common = set.intersection(*present) if present else set()
            for impl, d in f.defs.items():
                extra = [n for n in d or [] if n not in common]
                if extra:
                    lines.append(f"  {impl} only: {', '.join(extra)}")
    lines += [f"* {f.name}: shown, not scored: {PARTICULAR_FILES[f.name]}" for f in files if f.name in PARTICULAR_FILES]
    return "\n".join(lines)


def _short(member: str) -> str:
    """``impl_torch`` -> ``torch``, ``spec/reference`` -> ``ref``."""
    return "ref" if member == REFERENCE else member.removeprefix("impl_")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.skeleton", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--min-score", type=float, default=0.85, help="the lowest mean ratio that passes")
    p.add_argument("--min-pair", type=float, default=0.75, help="the lowest single (file, pair) ratio that passes")
    p.add_argument("--root", type=Path, default=ROOT,
                   help="the folder holding impl_torch/, impl_jax/, impl_tf/ and spec/reference/")
    p.add_argument("--table", action="store_true", help="print the table even when the thresholds are met")
    p.add_argument("--names", action="store_true", help="with the table, the definitions not every impl has")
    p.add_argument("--max-differ", type=int, default=8,
                   help="the most shared definitions whose argument lists may differ")
    p.add_argument("--signatures", action="store_true", help="list those definitions even when within the bound")
    args = p.parse_args(argv)
    files = scores(args.root)
    score, low = mean_score(files), min_pair(files)
    differ = differing_signatures(args.root)
    short = [f"{len(differ)} shared definitions differ in arguments > --max-differ {args.max_differ}"
             ] if len(differ) > args.max_differ else []
    if score < args.min_score:
        short.append(f"score {score:.2f} < --min-score {args.min_score:.2f}")
    if low < args.min_pair:
        below = [f"\n  {f.name} {_short(a)}~{_short(b)} {r:.2f}"
                 for f in files for (a, b), r in f.pairs.items() if r < args.min_pair]
        short.append(f"{len(below)} (file, pair) ratio(s) < --min-pair {args.min_pair:.2f}:" + "".join(below))
    if short or args.table:
        print(table(files, args.names))
    print(f"skeleton score {score:.2f}, lowest pair {low:.2f} over {sum(bool(f.pairs) for f in files)} files "
          f"(1.00 = the same definitions in the same order in every impl)")
    print(f"signatures: {len(differ)} shared definitions differ in arguments")
    if short or args.signatures:
        for name, sigs in differ.items():
            print(f"  {name}: " + "; ".join(f"{_short(i)} ({', '.join(a)})" for i, a in sigs.items()))
    for line in short:
        print(f"below threshold: {line}")
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main())
