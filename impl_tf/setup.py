"""Depends on the spec beside this folder and on TensorFlow: `pip install ./impl_tf` needs nothing else."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    """This folder is the package (flat layout): keep setup.py itself out of it."""

    def find_package_modules(self, package, package_dir):
        return [m for m in super().find_package_modules(package, package_dir) if m[1] != "setup"]


# tensorflow-cpu 2.16 pins ml-dtypes~=0.3.1, which conflicts with the spec's ml_dtypes>=0.4.
SPEC = (Path(__file__).resolve().parent.parent / "spec").as_uri()
setup(cmdclass={"build_py": BuildPy}, install_requires=[f"aiayn-spec @ {SPEC}", "tensorflow-cpu>=2.17"])
