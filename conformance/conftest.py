"""The conformance suite's fixtures: the backend under test, its models, and the judged tensors for the report.

    python -m pytest conformance --backend reference      # or torch, jax, tf, or mypkg.adapter

The options and hooks are ``conformance.plugin``'s, loaded by its entry point where the suite is installed; run
from a checkout where it is not, this file registers the plugin.
"""

from __future__ import annotations

import pytest

from conformance import capabilities, plugin
from spec import golden_cases, tolerance
from spec.weights_io import save_weights


def pytest_addoption(parser, pluginmanager):
    if not pluginmanager.is_registered(plugin):  # no entry point: the suite runs from a checkout
        pluginmanager.register(plugin, "aiayn_conformance")


@pytest.fixture(scope="session")
def backend(request):
    """The backend under test (``--backend``), each of its models' calls checked against what it supports."""
    b = capabilities.CheckedBackend(plugin.backend_module(plugin.backend_name(request.config)).make_backend())
    request.config._conformance.describe = b.describe()
    return b


@pytest.fixture(autouse=True)
def _declared_needs(request):
    """A check marked ``needs(...)`` is not supported by a backend that lacks one of them (before it runs)."""
    needs = [n for mark in request.node.iter_markers("needs") for n in mark.args]
    if needs:
        capabilities.require(request.getfixturevalue("backend").supports, *needs)


@pytest.fixture(scope="session")
def load_model(backend, tmp_path_factory):
    """``load_model(config, params)``: the backend's model from a canonical weights file, cached."""
    cache = {}

    def load(config, params):
        key = (config.to_json(), golden_cases.params_digest(params))
        if key not in cache:
            path = tmp_path_factory.mktemp("weights") / "model.safetensors"
            save_weights(path, config, params)
            cache[key] = backend.load(path)
        return cache[key]

    return load


@pytest.fixture(scope="session")
def model_for(load_model):
    """``model_for(case)``: the backend's model with a golden case's weights."""
    return lambda case: load_model(*golden_cases.case_params(case.meta, case.params))


@pytest.fixture
def record(record_property):
    """``record(verdicts)``: attach each judged tensor's errors to the report, then assert them all."""

    def rec(verdicts: dict[str, tolerance.Verdict]) -> None:
        rows = [{"tensor": n, "ok": v.ok, "ratio": v.ratio, "allowed_eps": v.max_eps_allowed,
                 "allowed_rms_eps": v.rms_eps_allowed, **v.stats.to_dict()} for n, v in verdicts.items()]
        record_property("tensors", rows)
        bad = [f"{n}: {v.reason()}" for n, v in verdicts.items() if not v.ok]
        assert not bad, "out of tolerance:\n  " + "\n  ".join(bad)

    return rec
