"""impl_torch stands alone (importing it loads no other framework) and exports the common API of spec.api."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import torch

import impl_torch
import spec.api


def test_import_loads_no_other_framework():
    others = ("jax", "jaxlib", "tensorflow", "keras", "impl_jax", "impl_tf")
    code = f"import sys, impl_torch; print(sorted(m for m in {others!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_exports_the_common_api():
    assert spec.api.check_api(impl_torch) == []
    assert impl_torch.__version__ == "0.2.0"
    assert (Path(impl_torch.__file__).parent / "py.typed").is_file()


def _example(doc: str) -> list[str]:
    """The indented code block after the first ``::`` of a docstring, dedented."""
    block = re.search(r"::\n\n((?:    .*\n|\n)+)", doc).group(1)
    return [line[4:] for line in block.rstrip().splitlines()]


def test_the_module_example_is_the_spec_api_example_and_runs(tmp_path, monkeypatch):
    """The same lines as spec.api's example with impl_torch imported, and they run as the comments say."""
    ours, theirs = _example(impl_torch.__doc__), _example(spec.api.__doc__)
    assert ours == [line.replace("import impl_torch as T                      # or: import impl_jax as T, "
                                 "import impl_tf as T", "import impl_torch as T") for line in theirs]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec("\n".join(ours), namespace)
    assert namespace["logits"].shape == (1, 3, 61) and namespace["logits"].dtype == torch.float32
    assert namespace["tokens"].dtype == torch.int64 and namespace["step_logits"].shape == (1, 1, 61)
    assert namespace["cache"].length == 1 and (tmp_path / "model.safetensors").is_file()


def test_type_hints_resolve_without_optional_extras():
    """The shape annotations (``spec.annotations``) resolve at run time, with or without jaxtyping installed."""
    import typing

    for f in (impl_torch.greedy_search, impl_torch.beam_search, impl_torch.train_step, impl_torch.load_weights,
              impl_torch.Transformer.forward, impl_torch.Transformer.encode, impl_torch.Transformer.init_cache,
              impl_torch.Transformer.decode):
        assert typing.get_type_hints(f)["return"] is not None, f
