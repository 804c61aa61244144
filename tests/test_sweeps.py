"""A recorded batch sweep (`bench --part batch`) in the Compare tab: read, tabled, drawn, and every bad
file refused in one line (workbench/sweeps.py, CompareTab.batch_sweep)."""

import json

from workbench import research_figures, sweeps
from workbench.tabs.compare import CompareTab


def sweep_file(path, rows, **extra) -> str:
    path.write_text(json.dumps({"part": "batch", "model": "m", "date": "2026-12-05", **extra, "rows": rows}))
    return str(path)


def row(batch, ar, **trees):
    return {"batch": batch, "ar": {"tokens_per_s": ar, "requests": 4},
            "medusa": {name: {"tokens_per_s": v} for name, v in trees.items()}}


def test_a_sweep_is_tabled_by_batch_with_the_fastest_tree_and_where_ar_wins(tmp_path):
    f = sweep_file(tmp_path / "s.json", [row(8, 400.0, a=300.0, b=380.0), row(1, 100.0, a=180.0, b=150.0),
                                         row(4, 300.0, a=330.0, b=360.0)])
    rows, msg, fig = CompareTab.batch_sweep(None, f)
    assert [r[0] for r in rows] == [1, 4, 8]  # sorted by batch
    assert [(r[3], r[5]) for r in rows] == [("a", 1.8), ("b", 1.2), ("b", 0.95)]
    assert msg.endswith("AR beats every tree at batch 8") and "s.json (m, 2026-12-05)" in msg
    assert len(fig.data) == 1 + 2 * 2  # AR, then each tree's tokens/s and its ratio over AR
    assert list(fig.data[2].y) == [1.8, 1.1, 0.75]


def test_files_from_before_named_trees_key_them_by_node_count(tmp_path):
    f = sweep_file(tmp_path / "old.json", [row(1, 100.0, **{"16": 150.0}), row(2, 150.0, **{"16": 200.0, "64": 210.0})])
    sweep = sweeps.read_sweep(f)
    assert sweep["trees"] == {"16 nodes": [150.0, 200.0], "64 nodes": [None, 210.0]}  # 64 was not run at batch 1
    assert sweeps.sweep_rows(sweep)[0][3] == "16 nodes"
    assert research_figures.batch_sweep_figure(sweep).data[3].y[0] is None
    assert CompareTab.batch_sweep(None, f)[1].endswith("a tree beats AR at every batch size recorded")


def test_a_batch_size_without_any_tree_is_not_counted_as_a_win(tmp_path):
    """A tree missing at some batch size (or a sweep of AR only) says so, not that a tree beat AR there."""
    f = sweep_file(tmp_path / "gap.json", [row(1, 100.0, a=150.0), row(2, 200.0), row(4, 300.0, a=250.0)])
    rows, msg, _ = CompareTab.batch_sweep(None, f)
    assert [r[3] for r in rows] == ["a", None, "a"]
    assert msg.endswith("AR beats every tree at batch 4; no tree was run at batch 2"), msg
    f = sweep_file(tmp_path / "ar_only.json", [row(1, 100.0), row(2, 200.0)])
    assert CompareTab.batch_sweep(None, f)[1].endswith("no tree was run at batch 1, 2")


def test_bad_sweeps_are_refused_in_one_line(tmp_path):
    (tmp_path / "text.json").write_text("not json")
    cases = {
        str(tmp_path / "text.json"): "not valid JSON",
        sweep_file(tmp_path / "norows.json", []): "not a batch sweep",
        sweep_file(tmp_path / "noar.json", [{"batch": 1, "medusa": {}}]): "lacks a field",
        sweep_file(tmp_path / "dup.json", [row(2, 1.0), row(2, 2.0)]): "distinct",
        sweep_file(tmp_path / "zero.json", [row(1, 0.0, a=1.0)]): "positive",
        sweep_file(tmp_path / "inf_ar.json", [row(1, float("inf"), a=1.0)]): "finite",  # Infinity or 1e999
        sweep_file(tmp_path / "inf_tree.json", [row(1, 1.0, a=float("inf"))]): "finite",
        sweep_file(tmp_path / "inf_batch.json", [row(float("inf"), 1.0)]): "whole number",
        sweep_file(tmp_path / "part_batch.json", [row(1.7, 1.0)]): "whole number",  # not read as batch 1
        sweep_file(tmp_path / "huge_batch.json", [row(2**70, 1.0, a=2.0)]): "at most",  # past plotly's 64-bit ints
        sweep_file(tmp_path / "odd_requests.json", [{**row(1, 1.0), "ar": {"tokens_per_s": 1.0, "requests": {}}}]):
            "requests",
        str(tmp_path / "missing.json"): "no such file",
    }
    for path, why in cases.items():
        rows, msg, fig = CompareTab.batch_sweep(None, path)
        assert rows == [] and fig is None and msg.startswith("✗") and why in msg and "\n" not in msg, (path, msg)


def test_only_the_listed_recorded_sweeps_can_be_picked(tmp_path):
    f = sweep_file(tmp_path / "x_batch.json", [row(1, 1.0, a=2.0)])
    assert sweeps.recorded_sweeps(tmp_path) == [f]
    assert CompareTab.batch_sweep(f, None)[1].startswith("✗ pick a recorded sweep")  # not in the repository's list
    for recorded in sweeps.recorded_sweeps():  # the repository's own files read and draw
        rows, msg, fig = CompareTab.batch_sweep(recorded, None)
        assert rows and fig is not None, msg


def test_the_files_words_stay_on_one_line_and_same_named_trees_keep_their_paths(tmp_path):
    f = sweep_file(tmp_path / "w.json", [row(1, 100.0, **{"a/tree_64.json": 150.0, "b/tree_64.json": 140.0})],
                   device="H200\n# heading\n\n" + "x" * 500)
    rows, msg, fig = CompareTab.batch_sweep(None, f)
    assert "\n" not in msg and "H200 # heading" in msg and "x" * 81 not in msg
    assert [t.name for t in fig.data[1::2]] == ["a/tree_64.json", "b/tree_64.json"]
