"""Depends on the spec beside this folder and on JAX: `pip install ./impl_jax` needs nothing else."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    """This folder is the package (flat layout): keep setup.py itself out of it."""

    def find_package_modules(self, package, package_dir):
        return [m for m in super().find_package_modules(package, package_dir) if m[1] != "setup"]


# jax 0.4.31 added jax.nn.dot_product_attention (the fused attention path); 0.4.30 lacks it.
SPEC = (Path(__file__).resolve().parent.parent / "spec").as_uri()
setup(cmdclass={"build_py": BuildPy}, install_requires=[f"aiayn-spec @ {SPEC}", "jax>=0.4.31"])
