"""Adapters to copy: the conformance suite's protocol over a model written elsewhere (docs/certify.md)."""
