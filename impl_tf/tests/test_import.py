"""Importing impl_tf loads TensorFlow and the spec, and none of the other frameworks."""

import subprocess
import sys


def test_import_loads_no_other_framework():
    others = ("torch", "jax", "jaxlib", "flax", "impl_torch", "impl_jax")
    code = ("import sys, impl_tf; "
            f"print(sorted(m for m in {others!r} if m in sys.modules)); "
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]", f"importing impl_tf loaded {out[0]}"
    assert out[1] == "True"
