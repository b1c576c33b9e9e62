"""Depends on the spec beside this folder: `pip install ./conformance` needs nothing else."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    """This folder is the package (flat layout): keep setup.py itself out of it."""

    def find_package_modules(self, package, package_dir):
        return [m for m in super().find_package_modules(package, package_dir) if m[1] != "setup"]


SPEC = (Path(__file__).resolve().parent.parent / "spec").as_uri()
setup(cmdclass={"build_py": BuildPy},
      install_requires=[f"aiayn-spec @ {SPEC}", "pytest>=8", "rich>=13", "hypothesis>=6"])
