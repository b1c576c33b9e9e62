"""A model that learns: a short run of the training demo (``tools.train_demo``) through each impl's common API
must reach a held-out exact match it reaches with margin. ``python -m tools.train_demo --backend <fw>`` is the full
run. An impl that is not installed is skipped; ``nox -s text`` installs all three.
"""

from __future__ import annotations

import importlib

import pytest

from tools import train_demo

# About half the full demo's 1500 steps; 90% leaves a margin below what each impl reaches there for another
# machine's rounding and dropout masks (the measurements: docs/decisions.md, "The training demo").
STEPS = 800
THRESHOLD = 0.90


@pytest.fixture(scope="module", params=train_demo.BACKENDS)
def impl(request):
    pytest.importorskip(f"impl_{request.param}")
    return importlib.import_module(f"impl_{request.param}")


def test_train_demo_learns_to_reverse(impl):
    # Checkpoints every 100 steps averaged as in the full run, evaluated at the end only.
    result = train_demo.run(impl, steps=STEPS, progress=False, evaluate_checkpoints=False)
    assert len(result["losses"]) == STEPS
    assert result["losses"][-1] < result["losses"][0] / 3, f"the loss barely fell: {train_demo.summary(result)}"
    assert result["accuracy"] >= THRESHOLD, train_demo.summary(result)
