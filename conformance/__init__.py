"""The conformance suite: one set of checks, run against every backend (see plugin.py and conftest.py)."""
