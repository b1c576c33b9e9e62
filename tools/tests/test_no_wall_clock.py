"""No test asserts on wall-clock time: a shared or loaded CI machine makes such a check fail at random, and speed is
the bench's to measure (warmed up, interleaved, as ratios), not a test's."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLOCKS = {"perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns", "process_time"}


def _reads_a_clock(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute | ast.Name)
               and (n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id) in CLOCKS
               for n in ast.walk(node))


def test_no_assert_reads_a_clock():
    tests = [p for p in ROOT.rglob("test_*.py") if not {".venv", ".nox", "build"} & set(p.relative_to(ROOT).parts)]
    assert len(tests) > 20, tests
    found = [f"{p.relative_to(ROOT)}:{n.lineno}" for p in tests for n in ast.walk(ast.parse(p.read_text()))
             if isinstance(n, ast.Assert) and _reads_a_clock(n.test)]
    assert not found, f"asserts on wall-clock time: {found}"
