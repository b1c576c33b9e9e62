"""The speed comparison: every backend and its framework's stock Transformer on the same workloads.

``nox -s bench`` runs ``bench.run`` once per framework, each in its own environment, then
``bench.report`` merges the results into JSON, Markdown, PNG charts and docs/speed.md's tables. It checks no
conformance: the suite is ``conformance``; the bench's own smoke checks are ``bench/tests``.
"""
