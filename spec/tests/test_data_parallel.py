"""The framework-neutral side of data-parallel training: data, split, command line, checkpoints, the loop."""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy

from spec import data_parallel as dp
from spec import data_parallel_cli as cli
from spec import demo
from spec.init import init_params

ARGS = ["--config", "tiny", "--dtype", "float32", "--batch", "8"]


def test_global_batch_is_a_function_of_seed_and_step():
    c = cli.config_of("tiny", "float32", 0.0)
    a, b, other = dp.global_batch(c, 3, 8, 0), dp.global_batch(c, 3, 8, 0), dp.global_batch(c, 4, 8, 0)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0], other[0]) and not np.array_equal(a[0], dp.global_batch(c, 3, 8, 1)[0])
    with pytest.raises(ValueError, match="steps count from 1"):
        dp.global_batch(c, 0, 8, 0)


def test_shards_are_contiguous_rows_that_tile_the_batch():
    c = cli.config_of("tiny", "float32", 0.0)
    batch = dp.global_batch(c, 1, 8, 0)
    parts = [dp.shard(batch, r, 4) for r in range(4)]
    for i, whole in enumerate(batch):
        assert np.array_equal(np.concatenate([p[i] for p in parts]), whole)
    assert sum(dp.token_count(p[2], c.pad_id) for p in parts) == dp.token_count(batch[2], c.pad_id)
    for rank, world in ((0, 3), (2, 2), (-1, 2)):
        with pytest.raises(ValueError, match="equal parts"):
            dp.shard(batch, rank, world)


def test_padded_shards_hold_each_shard_in_one_bucketed_shape():
    c = cli.config_of("tiny", "float32", 0.0)
    batch = dp.global_batch(c, 1, 6, 0)                                    # B = 6: shards of 3 rows, bucket 4
    padded = dp.padded_shards(batch, 2, c)
    for r, part in enumerate(padded):
        for x, raw in zip(part, dp.shard(batch, r, 2), strict=True):
            assert x.dtype == np.int32 and x.shape[0] == 4 and x.shape[1] >= raw.shape[1]
            assert np.array_equal(x[:3, :raw.shape[1]], raw) and (x[3:] == c.pad_id).all()
            assert (x[:, raw.shape[1]:] == c.pad_id).all()
    with pytest.raises(ValueError, match="equal parts"):
        dp.padded_shards(batch, 4, c)
    with pytest.raises(ValueError, match="tgt_out"):
        dp.padded_shards((batch[0], batch[1], batch[2][:, :-1]), 2, c)


@pytest.mark.parametrize("argv, message", [
    (["--batch", "9", "--data-parallel", "2"], "--batch 9 must be a multiple of --data-parallel 2"),
    (["--resume"], "--resume needs --checkpoint-dir"),
    (["--steps", "0"], "--steps must be at least 1"),
    (["--dropout", "1.5"], "dropout"),
])
def test_bad_command_lines_name_the_option(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.options(argv, "prog")
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_options_give_fp32_master_weights():
    o = cli.options([*ARGS, "--dropout", "0", "--kill-at", "5:1", "--record-steps", "1,10"], "prog")
    assert (o.config.param_dtype, o.config.dtype, o.config.dropout) == ("float32", "float32", 0.0)
    assert o.kill_at == (5, 1) and o.record_steps == (1, 10) and o.train_config.warmup_steps == 100


class FakeEngine:
    """One process, one worker: parameters that count the steps, so a resume that skipped or repeated one shows."""

    world, chief = 1, True

    def __init__(self, o: dp.Options):
        self.p = {k: np.zeros_like(v, np.float32) for k, v in init_params(o.config, 0).items()}

    def step(self, batch, keep_gradient):
        self.p = {k: v + batch[0].sum() for k, v in self.p.items()}
        return float(batch[0].sum()), ({k: np.ones_like(v) for k, v in self.p.items()} if keep_gradient else None)

    def params(self):
        return self.p

    def save(self, directory: Path) -> None:
        safetensors.numpy.save_file(self.p, str(directory / "model.safetensors"))

    def load(self, directory: Path) -> None:
        self.p = safetensors.numpy.load_file(str(directory / "model.safetensors"))

    def barrier(self) -> None:
        pass


def test_resumed_loop_takes_every_step_once(tmp_path):
    o = cli.options([*ARGS, "--steps", "5", "--checkpoint-every", "2", "--checkpoint-dir", str(tmp_path / "a"),
                    "--record", str(tmp_path / "rec"), "--record-steps", "5"], "prog")
    (tmp_path / "rec").mkdir()
    whole = FakeEngine(o)
    dp.run(whole, o, "fake", log=lambda _: None)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["step-00000002", "step-00000004", "step-00000005"]
    assert json.loads((tmp_path / "rec" / "losses.json").read_text())["first_step"] == 1
    assert (tmp_path / "rec" / "grad_5.safetensors").exists() and (tmp_path / "rec" / "params_5.safetensors").exists()

    first = cli.options([*ARGS, "--steps", "3", "--checkpoint-every", "2", "--checkpoint-dir", str(tmp_path / "b")],
                       "prog")
    dp.run(FakeEngine(first), first, "fake")
    (tmp_path / "b" / ".step-00000004.tmp").mkdir()  # a checkpoint a killed run left half-written
    resumed = FakeEngine(o)
    again = dataclasses.replace(o, checkpoint_dir=tmp_path / "b", resume=True, record=None)
    result = dp.run(resumed, again, "fake", log=lambda _: None)
    assert result["first_step"] == 4 and len(result["losses"]) == 2
    assert all(np.array_equal(resumed.p[k], whole.p[k]) for k in whole.p)


def test_resume_refuses_a_checkpoint_of_other_options(tmp_path):
    o = cli.options([*ARGS, "--steps", "2", "--checkpoint-dir", str(tmp_path)], "prog")
    dp.run(FakeEngine(o), o, "fake")
    other = cli.options([*ARGS, "--steps", "4", "--checkpoint-dir", str(tmp_path), "--resume", "--seed", "1"], "prog")
    with pytest.raises(ValueError, match="other seed"):
        dp.run(FakeEngine(other), other, "fake")


def test_the_held_out_set_is_decoded_by_the_average_of_the_last_checkpoints():
    """A single checkpoint's accuracy wanders while the learning rate is high; the paper averages the last 5."""
    argv = [*ARGS, "--steps", "13", "--checkpoint-every", "2", "--min-accuracy", "1"]
    o = cli.options(argv, "prog")
    engine, after = FakeEngine(o), {}
    step = engine.step

    def counted(batch, keep_gradient):
        out = step(batch, keep_gradient)
        after[len(after) + 1] = engine.p
        return out

    engine.step, decoded = counted, []
    _, expected = demo.heldout(o.config)
    T = types.SimpleNamespace(__name__="impl_fake", from_params=lambda config, p: decoded.append(p) or p,
                              greedy_search=lambda model, src, max_new_tokens: expected)
    cli.main(T, lambda _: engine, argv)
    last = [after[s] for s in (6, 8, 10, 12, 13)]
    assert len(decoded) == 1 and decoded[0].keys() == engine.p.keys()
    for name, got in decoded[0].items():
        np.testing.assert_array_equal(got, np.mean([p[name] for p in last], axis=0, dtype=np.float64)
                                      .astype(last[-1][name].dtype), err_msg=name)
