"""Figures, layout and every handler of the app, called directly; then the app over gradio_client."""

import json

import pytest

import trees
from workbench import figures
from workbench.handlers import EDITOR, Workbench, safe_name, step_view
from workbench.layout import tidy_layout, tree_graph


@pytest.fixture(scope="module")
def wb(demo_engine, tmp_path_factory):
    return Workbench(demo_engine, tmp_path_factory.mktemp("wbdata"))


@pytest.fixture(scope="module")
def run(wb):
    events = list(wb.stream("def main():\n", "mc_sim_7b_63", "", "medusa", "greedy", 0.7, 40))
    return events[-1]["traces"]


def _segments_cross(p1, p2, p3, p4):
    def ccw(a, b, c):
        return (c[1] - a[1]) * (b[0] - a[0]) - (b[1] - a[1]) * (c[0] - a[0])
    if len({p1, p2, p3, p4}) < 4:
        return False  # edges that share an endpoint do not cross
    return ccw(p1, p3, p4) * ccw(p2, p3, p4) < 0 and ccw(p1, p2, p3) * ccw(p1, p2, p4) < 0


@pytest.mark.parametrize("tree", ["mc_sim_7b_63", "kary_3x3", "chain_4"])
def test_layout_centred_and_crossing_free(tree):
    g = tree_graph(trees.validate(trees.preset(tree)))
    pos = tidy_layout(g)
    for u in g.nodes:
        kids = sorted(g.successors(u), key=lambda v: g.nodes[v]["path"])
        if kids:
            assert pos[u][0] == pytest.approx((pos[kids[0]][0] + pos[kids[-1]][0]) / 2)
            assert all(pos[v][1] == pos[u][1] - 1 for v in kids)
    edges = [(pos[u], pos[v]) for u, v in g.edges]
    for i, (a, b) in enumerate(edges):
        for c, d in edges[i + 1:]:
            assert not _segments_cross(a, b, c, d)


def test_step_tree_figure_matches_trace(run):
    tr = run[0]
    fig = figures.step_tree_figure(tr)
    status = figures.node_status(tr)
    marker_traces = [t for t in fig.data if t.mode == "markers+text"]
    shown = {t.name: len(t.x) for t in marker_traces}
    for s in set(status):
        assert shown[s] == status.count(s)
    acc = next(t for t in marker_traces if t.name == "accepted") if "accepted" in shown else None
    if acc is not None:
        assert all(c == figures.COLORS["accepted"] for c in [acc.marker.color])
    bold = next(t for t in fig.data if t.name == "accepted path")
    assert sum(x is None for x in bold.x) == len(tr["accepted_nodes"]) - 1  # one bold edge per accepted node
    rows = figures.node_rows(tr)
    assert [r["token_text"] for r in rows] == tr["node_text"]
    for step in run:  # a rejected node names, as text, what the target chose at its parent
        parents = trees.buffers(step["tree"]).parent.tolist()
        for r in figures.node_rows(step):
            if r["status"] == "rejected":
                assert r["why"] == f"target chose {step['target_argmax_text'][parents[r['node']]]!r} at the parent"
    # pruning keeps the accepted path
    pruned = figures.step_tree_figure(tr, min_path_prob=0.5)
    assert sum(len(t.x) for t in pruned.data if t.mode == "markers+text") <= len(rows)


def test_other_figures(run):
    assert len(figures.run_figure(run).data[0].y) == len(run)
    assert figures.head_topk_figure(figures.with_next_tokens(run)[0]).data
    vec = trees.rank_vectors(run)
    hs = trees.head_stats(vec, 4)
    assert len(figures.head_accuracy_figure(hs).data) == 4
    assert figures.calibration_figure(run).data
    assert "predicted E" in figures.tree_figure(trees.preset("chain_3"), hs.accuracy()).layout.title.text
    curve = trees.select_size(lambda n: 1 + n / 10, [(1, 1.0), (65, 2.0)], [1, 4, 8]).curve
    assert len(figures.size_curve_figure(curve).data[0].x) == 3


def test_stream_equals_ar_and_scrub(wb, run, demo_engine):
    ar = demo_engine.generate("def main():\n", 40, mode="ar")
    assert [t for s in run for t in s["accepted_tokens"]] == ar.token_ids
    tree_fig, head_fig, table = step_view(run, 2)
    assert tree_fig.layout.title.text.startswith("step 2")
    assert len(table) == 64 and head_fig.data


def test_handler_errors_are_messages(wb):
    assert list(wb.stream("   ", "mc_sim_7b_63", "", "medusa", "greedy", 0.7, 10)) == [{"error": "the prompt is empty"}]
    ev = list(wb.stream("x", EDITOR, "[[0, 1]]", "medusa", "greedy", 0.7, 10))
    assert "prefix [0] is missing" in ev[0]["error"]
    ev = list(wb.stream("x", "mc_sim_7b_63", "", "medusa", "greedy", 0.7, 5000))
    assert "exceeds the context" in ev[0]["error"]
    ev = list(wb.stream("x" * 30000, "mc_sim_7b_63", "", "medusa", "greedy", 0.7, 5))
    assert "limit is 20000" in ev[0]["error"]
    msg, fig, _ = wb.validate_tree("{not json")
    assert msg.startswith("✗ not valid JSON") and fig is None
    msg, _, _ = wb.validate_tree("[[0], [0, 0, 0]]")
    assert "prefix [0, 0] is missing" in msg
    msg, _, _ = wb.validate_tree(json.dumps([[0]] + [[0] * d for d in range(2, 6)]))
    assert "exceeds the 4 heads" in msg


def test_editor_save_load_export_diff(wb, tmp_path):
    text, msg = wb.edit_tree("[[0]]", "add child", "[0]", 1)
    assert json.loads(text) == [[0], [0, 1]] and "added" in msg
    text, msg = wb.edit_tree(text, "add sibling", "[0]", 2)
    assert json.loads(text) == [[0], [2], [0, 1]]
    text, msg = wb.edit_tree(text, "delete subtree", "[0]", 0)
    assert json.loads(text) == [[2]]
    _, msg = wb.edit_tree("[[0]]", "add child", "[5]", 0)
    assert "prefix [5] is missing" in msg
    msg, path = wb.save_tree("../../etc/passwd", "[[0], [1]]")
    assert msg.startswith("✓") and path.startswith(str(wb.tree_dir)) and "etc_passwd" in path
    assert trees.load_tree(path).medusa_choices == [[0], [1]]
    msg, _ = wb.save_tree("etc_passwd", "[[0]]")
    assert "already saved" in msg and trees.load_tree(path).medusa_choices == [[0], [1]]
    assert wb.save_tree("etc_passwd", "[[0]]", overwrite=True)[0].startswith("✓")
    assert "saved/etc_passwd" in wb.tree_names()
    assert wb.resolve_choice("saved/etc_passwd", "") == [[0]]
    assert wb.export_tree("[[0], [0, 0]]", "vllm") == "[(0,), (0, 0)]"
    assert "added 1" in wb.diff_trees("chain_1", "chain_2", "")
    with pytest.raises(ValueError):
        safe_name("../..")


def test_tune_collect_and_optimise(wb):
    assert "collected" in wb.collect(2, 32)
    tree_json, msg = wb.optimize_tree(12)
    assert msg.startswith("✓") and len(json.loads(tree_json)) == 12
    assert wb.optimize_tree(0)[1].startswith("✗")
    msg = wb.confirm_tree(tree_json, 2, 32)
    assert "predicted" in msg and "measured" in msg and "12 nodes" in msg


def test_app_over_gradio_client(wb):
    from gradio_client import Client

    from workbench.app import serve

    app, url = serve(wb, block=False)  # the app's own launch settings
    try:
        c = Client(url, verbose=False)
        out = c.predict("import os\n", "mc_sim_7b_63", "medusa", "greedy", 20, api_name="/generate")
        assert len(out["token_ids"]) == 20 and out["mean_accepted"] >= 1
        msg, _ = c.predict("[[1, 0]]", api_name="/validate_tree")
        assert "prefix [1] is missing" in msg
        tree_json, msg = c.predict(8, "empirical", api_name="/optimize_tree")
        assert msg.startswith("✓") and len(json.loads(tree_json)) == 8
        as_json = c.predict("import os\n", "[[0], [0, 0]]", "medusa", "greedy", 20, api_name="/generate")
        assert as_json["token_ids"] == out["token_ids"]  # a tree given as JSON: same greedy output
        bad = c.predict("", "mc_sim_7b_63", "medusa", "greedy", 20, api_name="/generate")
        assert bad == {"error": "the prompt is empty"}
        again = c.predict("import os\n", "mc_sim_7b_63", "medusa", "greedy", 20, api_name="/generate")
        assert again["token_ids"] == out["token_ids"]  # still serving, same greedy output
    finally:
        app.close()
