"""Each name has one home. No module uses a private name (one leading underscore) of another of the project's
modules: ``from m import _x``, or ``m._x`` where ``m`` names a module; such a name is an interface nobody declared
and a rename breaks it unseen. And the backends are listed once, in ``spec.api.BACKENDS``: a copied list goes
stale when a backend comes or goes. Both read the source (``ast``) and import none of it."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from spec.api import BACKENDS

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("spec", "impl_torch", "impl_jax", "impl_tf", "conformance", "text", "tools", "bench", "certify")

# Private names used across modules that stay, each with its reason. The test also fails on an entry that no longer
# occurs, so the list only shrinks.
ALLOWED_PRIVATE = {
    # A mutant replaces one of the reference's internals on purpose: that is what it is for.
    "conformance/mutations_lm.py: spec.sampling._sample_row",
}
# Lists of the backends written out where spec.api cannot be imported, or in files this check does not own yet.
ALLOWED_LISTS = {
    "spec/api/__init__.py",    # the list itself
    "tools/train_report.py",   # runs where only matplotlib is installed (nox's train_demo_report, lm_demo_report)
    "conformance/report.py", "tools/tests/test_convert_hf.py",
    "tools/tests/test_conformance_runner.py",
}
BACKEND_NAMES = set(BACKENDS)


@functools.cache
def _sources() -> list[tuple[str, str, list[ast.AST]]]:
    """(path from the root, module name, the nodes the checks read) of every Python file of the project's packages."""
    sources = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if "build" in rel.parts:  # a wheel build's copies of the sources (setuptools' build/lib), not sources
                continue
            parts = list(rel.with_suffix("").parts)
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            sources.append((rel.as_posix(), name, nodes(ast.parse(path.read_text(), str(rel)))))
    return sources


def nodes(tree: ast.Module) -> list[ast.AST]:
    """The imports, the private attributes and the sequence literals of ``tree``: what the checks read, in one walk."""
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom | ast.Tuple | ast.List | ast.Set)
            or isinstance(n, ast.Attribute) and _private(n.attr)]


def _is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module ``from ... import`` reads, relative imports resolved against ``module``."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts[:len(parts) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def private_uses(rel: str, module: str, tree: list[ast.AST]) -> set[str]:
    """``"<file>: <module>.<name>"`` for each private name of another project module this file uses."""
    found, modules = set(), {}
    for node in tree:
        if isinstance(node, ast.ImportFrom):
            source = _absolute(node, module, rel.endswith("__init__.py"))
            for alias in node.names:
                if source.split(".")[0] in PACKAGES and _private(alias.name):
                    found.add(f"{rel}: {source}.{alias.name}")
                if _is_module(f"{source}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{source}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                modules[alias.asname or top] = alias.name if alias.asname else top
    for node in tree:
        if isinstance(node, ast.Attribute):
            chain, base = [], node.value
            while isinstance(base, ast.Attribute):
                chain.insert(0, base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules:
                target = ".".join([modules[base.id], *chain])
                if target.split(".")[0] in PACKAGES and target != module and _is_module(target):
                    found.add(f"{rel}: {target}.{node.attr}")
    return found


def backend_lists(tree: list[ast.AST]) -> list[int]:
    """The lines of each tuple, list or set literal naming every backend (``("torch", "jax", "tf")``, with others)."""
    return [node.lineno for node in tree if isinstance(node, ast.Tuple | ast.List | ast.Set)
            and BACKEND_NAMES <= {e.value for e in node.elts if isinstance(e, ast.Constant)}]


def test_no_private_name_is_used_across_modules():
    found = set().union(*(private_uses(rel, module, tree) for rel, module, tree in _sources()))
    new, gone = sorted(found - ALLOWED_PRIVATE), sorted(ALLOWED_PRIVATE - found)
    assert not new, "private names used across modules:\n" + "\n".join(new)
    assert not gone, "no longer used, take them off ALLOWED_PRIVATE:\n" + "\n".join(gone)


def test_the_backends_are_listed_in_spec_api_only():
    found = {rel: lines for rel, _, tree in _sources() if (lines := backend_lists(tree))}
    assert set(found) - ALLOWED_LISTS == set(), {rel: found[rel] for rel in set(found) - ALLOWED_LISTS}
    assert ALLOWED_LISTS <= set(found), ALLOWED_LISTS - set(found)


def test_the_scan_sees_both_forms():
    """The scan itself: a private import and a private attribute of an imported module are caught, a private
    name of the file's own module, a dunder and a private attribute of an object are not."""
    code = ("from spec.config import _require, Config\nimport spec.sampling as S\nfrom spec import shapes\n"
            "S._sample_row(); shapes._x; spec.__version__; self._cache; Config()._y\n")
    assert private_uses("t.py", "tools.t", nodes(ast.parse(code))) == {
        "t.py: spec.config._require", "t.py: spec.sampling._sample_row", "t.py: spec.shapes._x"}
    assert backend_lists(nodes(ast.parse('A = ("tf", "jax", "torch", "reference")\nB = ["torch", "jax"]\n'))) == [1]
