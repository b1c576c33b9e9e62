"""Data-parallel training on DDP (``impl_torch.train_dp``), what is particular to torch: the world size torchrun
started and the process group the engine needs. Two workers against one device, resume and a killed worker are the
data-parallel conformance's (``nox -s train_dp``), for every backend."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from impl_torch import train_dp
from spec import data_parallel_cli


def test_world_size_must_match_data_parallel(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(SystemExit, match="--data-parallel 2, but torchrun started 3 processes"):
        train_dp.main(["--data-parallel", "2", "--config", "tiny", "--steps", "1"])
    assert not dist.is_initialized()


def test_engine_needs_a_process_group():
    with pytest.raises(ValueError, match="process group"):
        train_dp.DataParallel(data_parallel_cli.options(["--config", "tiny"], "test"))

