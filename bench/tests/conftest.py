"""The bench's smoke checks run once per framework whose impl is installed beside the bench (``nox -s tests``
installs all three, with the jax peer, Flax); a framework whose impl is missing is skipped, a bench module that
does not import (its peer missing) fails."""

from __future__ import annotations

import importlib

import pytest

from spec.api import BACKENDS


@pytest.fixture(scope="module", params=BACKENDS)
def framework(request) -> str:
    pytest.importorskip(f"impl_{request.param}")
    importlib.import_module(f"bench.bench_{request.param}")
    return request.param
