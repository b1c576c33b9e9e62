"""``tools.translate_report``: the demo's report says how the training processes ran."""

from tools.translate_report import process_line

RETAIN = {"M_TRIM_THRESHOLD": 2147483647, "M_MMAP_MAX": 0, "M_ARENA_MAX": 1}


def test_one_line_when_every_training_ran_alike():
    line = process_line({"process": {s: {"threads": 1, "malloc": RETAIN} for s in ("torch", "tf", "peer")}})
    assert "M_MMAP_MAX 0" in line and "M_TRIM_THRESHOLD 2,147,483,647" in line and "differ" not in line
    assert "1 intra-op thread(s)" in line  # as recorded, not assumed


def test_settings_that_differ_are_named_per_system():
    line = process_line({"process": {"torch": {"malloc": RETAIN}, "peer": {"malloc": {}}}})
    assert "differ" in line and "impl_torch {" in line and "torch.nn.Transformer (peer) defaults" in line


def test_nothing_is_said_for_runs_that_recorded_nothing():
    assert process_line({"runs": {}}) == ""
