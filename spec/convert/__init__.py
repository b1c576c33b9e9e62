"""Canonical weights to and from other libraries' checkpoints, in NumPy (no framework import): ``marian``."""
