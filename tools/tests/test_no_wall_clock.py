"""No test asserts on wall-clock time: a shared or loaded CI machine makes such a check fail at random, and speed is
the bench's to measure (warmed up, interleaved, as ratios), not a test's."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLOCKS = {"perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns", "process_time"}


def _reads_a_clock(node: ast.AST, timed: set[str]) -> bool:
    """Whether ``node`` calls a clock or uses one of the names in ``timed``."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute | ast.Name)
               and (n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id) in CLOCKS
               or isinstance(n, ast.Name) and n.id in timed for n in ast.walk(node))


def _timed_names(scope: ast.AST) -> set[str]:
    """The names in ``scope`` bound to a value that reads a clock, directly or through another such name."""
    binds = [n for n in ast.walk(scope) if isinstance(n, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.NamedExpr)
             and n.value is not None]
    timed: set[str] = set()
    while True:
        new = {t.id for b in binds if _reads_a_clock(b.value, timed)
               for target in (b.targets if isinstance(b, ast.Assign) else [b.target])
               for t in ast.walk(target) if isinstance(t, ast.Name)} - timed
        if not new:
            return timed
        timed |= new


def clock_asserts(source: str) -> list[int]:
    """The lines of the asserts in ``source`` that read a clock: in the assert itself, or through a name that a
    clock read was assigned to in the same function (or, outside functions, in the module)."""
    tree = ast.parse(source)
    scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))]
    found = set()
    for scope in scopes:
        timed = _timed_names(scope) if scope is not tree else _timed_names(ast.Module(
            [s for s in tree.body if not isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)], []))
        found |= {n.lineno for n in ast.walk(scope) if isinstance(n, ast.Assert) and _reads_a_clock(n.test, timed)}
    return sorted(found)


def test_no_assert_reads_a_clock():
    tests = [p for p in ROOT.rglob("test_*.py") if not {".venv", ".nox", "build"} & set(p.relative_to(ROOT).parts)]
    assert len(tests) > 20, tests
    found = [f"{p.relative_to(ROOT)}:{line}" for p in tests for line in clock_asserts(p.read_text())]
    assert not found, f"asserts on wall-clock time: {found}"


def test_the_scan_sees_a_clock_in_the_assert_itself():
    assert clock_asserts("import time\ndef test():\n    t0 = time.time()\n    assert time.time() - t0 < 5\n") == [4]


def test_the_scan_follows_a_clock_read_into_the_name_an_assert_uses():
    source = ("from time import perf_counter\n"
              "def test():\n"
              "    t0 = perf_counter()\n"
              "    run()\n"
              "    elapsed = perf_counter() - t0\n"
              "    seconds: float = elapsed\n"
              "    assert seconds < 5, seconds\n")
    assert clock_asserts(source) == [7]


def test_the_scan_passes_an_assert_on_no_clock():
    source = ("import time\n"
              "def test():\n"
              "    t0 = time.time()\n"
              "    n = run()\n"
              "    print(time.time() - t0)\n"
              "    assert n == 5\n")
    assert clock_asserts(source) == []
