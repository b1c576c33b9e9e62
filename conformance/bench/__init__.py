"""The speed comparison: every backend and its framework's stock Transformer on the same workloads.

``nox -s bench`` runs ``conformance.bench.run`` once per framework, each in its own environment, then
``conformance.bench.report`` merges the results into JSON, Markdown, PNG charts and the README's table.
"""
