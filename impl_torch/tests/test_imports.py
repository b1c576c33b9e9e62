"""impl_torch stands alone: importing it loads no other framework."""

from __future__ import annotations

import subprocess
import sys


def test_import_loads_no_other_framework():
    others = ("jax", "jaxlib", "tensorflow", "keras", "impl_jax", "impl_tf")
    code = f"import sys, impl_torch; print(sorted(m for m in {others!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
