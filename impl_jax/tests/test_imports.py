"""Importing impl_jax loads JAX and the spec, and no other framework."""

from __future__ import annotations

import subprocess
import sys


def test_import_loads_no_other_framework():
    code = "import sys, impl_jax; print(sorted(m for m in ('torch', 'tensorflow', 'jax') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['jax']"
