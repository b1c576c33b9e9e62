"""tools.skeleton on small made-up impls: the names it reads, the measure, the thresholds and the exit status."""

from __future__ import annotations

import pytest

from tools import skeleton

MODEL = """
def helper(): ...
class Model:
    def forward(self): ...
    def decode(self): ...
x = 1
"""


def _impls(root, files: dict[str, dict[str, str]]):
    """``files``: {impl: {file name: source}} written under ``root``."""
    for impl in skeleton.IMPLS:
        (root / impl).mkdir()
        for name, source in files.get(impl, {}).items():
            (root / impl / name).write_text(source)
    return root


def test_names_in_source_order_with_methods(tmp_path):
    (tmp_path / "m.py").write_text(MODEL + "async def later(): ...\n")
    assert skeleton.names(tmp_path / "m.py") == ["helper", "Model", "Model.forward", "Model.decode", "later"]


def test_identical_impls_score_one_and_pass(tmp_path, capsys):
    root = _impls(tmp_path, {impl: {"model.py": MODEL, "__init__.py": ""} for impl in skeleton.IMPLS})
    files = skeleton.scores(root)
    assert [f.name for f in files] == ["__init__.py", "model.py"]
    assert skeleton.mean_score(files) == 1.0 and skeleton.min_pair(files) == 1.0
    assert skeleton.main(["--root", str(root)]) == 0
    assert "skeleton score 1.00" in capsys.readouterr().out


def test_missing_file_scores_zero_for_its_pairs(tmp_path):
    root = _impls(tmp_path, {"impl_torch": {"model.py": MODEL, "extra.py": "def f(): ...\n"},
                             "impl_jax": {"model.py": MODEL}, "impl_tf": {"model.py": MODEL}})
    extra = {f.name: f for f in skeleton.scores(root)}["extra.py"]
    assert extra.defs["impl_jax"] is None
    assert extra.pairs == {("impl_torch", "impl_jax"): 0.0, ("impl_torch", "impl_tf"): 0.0,
                           ("impl_jax", "impl_tf"): 0.0}  # two missing files: a pair of absences scores 0 too
    assert skeleton.mean_score(skeleton.scores(root)) == pytest.approx(0.5)


def test_ratio_is_difflibs_over_names(tmp_path):
    other = MODEL.replace("def decode", "def generate")  # one method of five renamed
    root = _impls(tmp_path, {"impl_torch": {"model.py": MODEL}, "impl_jax": {"model.py": MODEL},
                             "impl_tf": {"model.py": other}})
    (f,) = skeleton.scores(root)
    assert f.pairs[("impl_torch", "impl_jax")] == 1.0
    assert f.pairs[("impl_torch", "impl_tf")] == pytest.approx(2 * 3 / 8)  # 3 of 4 names match, in order
    assert skeleton.min_pair([f]) == pytest.approx(0.75)
    assert skeleton.mean_score([f]) == pytest.approx((1 + 0.75 + 0.75) / 3)


def test_thresholds_exit_one_with_the_table(tmp_path, capsys):
    other = MODEL.replace("def decode", "def generate")
    root = _impls(tmp_path, {"impl_torch": {"model.py": MODEL}, "impl_jax": {"model.py": MODEL},
                             "impl_tf": {"model.py": other}})
    assert skeleton.main(["--root", str(root)]) == 1                        # the defaults: 0.85 and 0.75
    out = capsys.readouterr().out
    assert "model.py" in out and "torch~tf" in out and "score 0.83 < --min-score 0.85" in out
    assert "--min-pair" not in out                                          # 0.75 is not below 0.75
    assert skeleton.main(["--root", str(root), "--min-score", "0", "--min-pair", "0.8"]) == 1
    out = capsys.readouterr().out
    assert "2 (file, pair) ratio(s) < --min-pair 0.80" in out and "model.py jax~tf 0.75" in out
    assert skeleton.main(["--root", str(root), "--min-score", "0.8", "--min-pair", "0.75"]) == 0


def test_the_reference_joins_only_for_its_files(tmp_path, capsys):
    root = _impls(tmp_path, {impl: {"model.py": MODEL, "search.py": "def greedy(): ...\n"} for impl in skeleton.IMPLS})
    (root / skeleton.REFERENCE).mkdir(parents=True)
    (root / skeleton.REFERENCE / "model.py").write_text(MODEL.replace("def decode", "def generate"))
    (root / skeleton.REFERENCE / "search.py").write_text("def other(): ...\n")  # not a file of the reference's role
    by_name = {f.name: f for f in skeleton.scores(root)}
    assert set(by_name["search.py"].defs) == set(skeleton.IMPLS) and len(by_name["search.py"].pairs) == 3
    model = by_name["model.py"]
    assert len(model.pairs) == 6 and model.pairs[(skeleton.REFERENCE, "impl_torch")] == pytest.approx(0.75)
    assert skeleton.main(["--root", str(root), "--table"]) == 0           # mean (3 * 0.75 + 6 * 1) / 9
    out = capsys.readouterr().out
    assert "ref~torch" in out and "skeleton score 0.92, lowest pair 0.75" in out


def test_a_particular_file_is_shown_marked_but_not_scored(tmp_path, capsys):
    (name, reason), = list(skeleton.PARTICULAR_FILES.items())[:1]
    root = _impls(tmp_path, {"impl_torch": {"model.py": MODEL}, "impl_jax": {"model.py": MODEL},
                             "impl_tf": {"model.py": MODEL, name: "def program(): ...\n"}})
    by_name = {f.name: f for f in skeleton.scores(root)}
    assert by_name[name].defs["impl_tf"] == ["program"] and by_name[name].pairs == {}
    assert skeleton.mean_score(list(by_name.values())) == 1.0 and skeleton.min_pair(list(by_name.values())) == 1.0
    assert skeleton.main(["--root", str(root), "--table"]) == 0              # its absences score no 0s
    out = capsys.readouterr().out
    assert f"{name}*" in out and f"* {name}: shown, not scored: {reason}" in out and "over 1 files" in out


def test_differing_argument_lists_of_shared_definitions_are_counted_and_bounded(tmp_path, capsys):
    torch_model = MODEL.replace("def forward(self)", "def forward(self, x, device=None)")  # plumbing left out
    other = MODEL.replace("def forward(self)", "def forward(self, y)").replace("def helper()", "def helper(a)")
    root = _impls(tmp_path, {"impl_torch": {"model.py": torch_model},
                             "impl_jax": {"model.py": MODEL.replace("def forward(self)", "def forward(self, x)")},
                             "impl_tf": {"model.py": other}})
    differ = skeleton.differing_signatures(root)
    assert differ == {"model.py:Model.forward": {"impl_torch": ["x"], "impl_jax": ["x"], "impl_tf": ["y"]},
                      "model.py:helper": {"impl_torch": [], "impl_jax": [], "impl_tf": ["a"]}}
    assert skeleton.main(["--root", str(root), "--min-score", "0", "--min-pair", "0", "--max-differ", "1"]) == 1
    out = capsys.readouterr().out
    assert "2 shared definitions differ in arguments > --max-differ 1" in out and "tf (y)" in out
    assert skeleton.main(["--root", str(root), "--min-score", "0", "--min-pair", "0", "--max-differ", "2"]) == 0
