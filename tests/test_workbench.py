"""The workbench's layout, figures and handlers called as plain functions; then the app over gradio_client."""

import contextlib
import io
import json
import math
import re
import threading
import time
from pathlib import Path

import pytest

import trees
from workbench import figures
from workbench.core import EDITOR
from workbench.layout import Box, place_labels, text_width_px, tidy_layout, tree_graph
from workbench.session import RunState, UserError


@pytest.fixture(scope="module")
def run(tabs, wb):
    session = wb.sessions.get("fixture")
    events = list(tabs.decode.decode(session, "def main():\n", "mc_sim_7b_63", "", "medusa", "greedy", 0.7, 1.0, 0, 60))
    assert events[-1]["done"]
    return session.run


def _segments_cross(p1, p2, p3, p4):
    def ccw(a, b, c):
        return (c[1] - a[1]) * (b[0] - a[0]) - (b[1] - a[1]) * (c[0] - a[0])
    if len({p1, p2, p3, p4}) < 4:
        return False  # edges that share an endpoint do not cross
    return ccw(p1, p3, p4) * ccw(p2, p3, p4) < 0 and ccw(p1, p2, p3) * ccw(p1, p2, p4) < 0


@pytest.mark.parametrize("tree", ["mc_sim_7b_63", "kary_3x3", "chain_4", "big"])
def test_layout_uses_the_width_is_centred_and_crossing_free(tree):
    paths = trees.kary(4, 4)[:255] if tree == "big" else trees.preset(tree)
    g = tree_graph(trees.validate(paths))
    pos = tidy_layout(g)
    xs = [x for x, _ in pos.values()]
    if len([n for n in g.nodes if g.out_degree(n) == 0]) > 1:
        assert min(xs) == 0 and max(xs) == 1  # the leaves span the whole width
    for u in g.nodes:
        kids = sorted(g.successors(u), key=lambda v: g.nodes[v]["path"])
        if kids:
            assert pos[u][0] == pytest.approx((pos[kids[0]][0] + pos[kids[-1]][0]) / 2)
            assert all(pos[v][1] == pos[u][1] - 1 for v in kids)
    edges = [(pos[u], pos[v]) for u, v in g.edges]
    for i, (a, b) in enumerate(edges):
        for c, d in edges[i + 1:]:
            assert not _segments_cross(a, b, c, d)


def test_label_placement_never_overlaps_and_keeps_the_important_first():
    import random

    rng = random.Random(0)
    boxes = [Box(rng.uniform(0, 500), rng.uniform(0, 300), rng.uniform(10, 60), 14) for _ in range(400)]
    kept = place_labels(boxes, list(range(400)))
    assert 0 in kept and len(kept) < 400
    for i in kept:
        for j in kept:
            assert i == j or not boxes[i].overlaps(boxes[j])
    for i in set(range(400)) - set(kept):  # every box left out overlaps one kept before it
        assert any(boxes[i].overlaps(boxes[j]) for j in kept if j < i)


def test_step_tree_figure_matches_the_trace(run):
    for tr in run.traces[:10]:
        rows = figures.node_rows(tr)
        assert [r["token_text"] for r in rows] == tr["node_text"]
        status = figures.node_status(tr)
        fig = figures.step_tree_figure(tr, figures.TreeView(show_all=True))
        shown = {t.name: len(t.x) for t in fig.data if t.mode == "markers"}
        for s in set(status):
            assert shown[s] == status.count(s)
        bold = next((t for t in fig.data if t.name == "accepted path"), None)
        edges = sum(x is None for x in bold.x) if bold is not None else 0
        assert edges == len(tr["accepted_nodes"]) - 1  # one bold edge per accepted node
        # the ghost: the target's choice after the last accepted node (the next root) is always shown
        ghost = next(t for t in fig.data if t.name == "target's token (ghost)")
        assert any(tr["target_argmax_text"][tr["accepted_nodes"][-1]] in h for h in ghost.hovertext)
        for r in rows:  # a rejected node names, as text, what the target chose at its parent
            if r["status"] == "rejected":
                assert r["why"] == f"target chose {tr['target_argmax_text'][tr['parent'][r['node']]]!r} at the parent"


def test_pruning_keeps_the_accepted_path_and_its_siblings_and_collapse_folds(run):
    tr = max(run.traces, key=lambda t: len(t["accepted_nodes"]))
    accepted = set(tr["accepted_nodes"])
    siblings = {i for i, p in enumerate(tr["parent"]) if p in accepted}
    fig = figures.step_tree_figure(tr, figures.TreeView(min_path_prob=1.0))
    drawn = int(re.search(r"(\d+) drawn", fig.layout.title.text).group(1)) + 1
    assert drawn == len(accepted | siblings | {0})
    first = tr["tree"][tr["accepted_nodes"][1] - 1]
    below = sum(1 for p in tr["tree"] if len(p) > len(first) and p[: len(first)] == first)
    folded = figures.step_tree_figure(tr, figures.TreeView(show_all=True, collapsed=frozenset({tuple(first)})))
    assert int(re.search(r"(\d+) drawn", folded.layout.title.text).group(1)) == len(tr["tree"]) - below
    assert any(f"+{below}" in t for d in folded.data if d.mode == "text" for t in d.text)


def test_head_panel_marks_the_token_that_came(run):
    step = 3
    tr = run.traces[step]
    nxt = figures.next_tokens(run.traces, step)
    fig = figures.head_panel(tr, nxt, [tuple(h) for h in run.head_hits])
    labels = [d for d in fig.data if d.type == "scatter"]  # each head's bar labels, beside its bars
    assert len(labels) == len(tr["head_topk"])
    for h, shown in enumerate(labels):
        marked = [i for i, t in enumerate(shown.text) if "◀ next" in t]
        ranks = [i for i, c in enumerate(tr["head_topk"][h]) if c["token"] == nxt[h]]
        assert marked == ranks  # marked exactly where the real token sat (nowhere if it missed the top-k)


def test_head_panel_leaves_the_browser_nothing_to_measure_and_keeps_its_margins(run):
    """It is redrawn at every step with new tokens (issue 31): no bar carries an outside label and no axis
    has automargin (Plotly measures both at every draw), the left margin holds every token label, and it
    stays put from step to step unless a label of wide characters needs more."""
    figs = [figures.head_panel(t, figures.next_tokens(run.traces, i)) for i, t in enumerate(run.traces[:8])]
    for fig in figs:
        assert [d.text for d in fig.data if d.type == "bar" and d.text is not None] == []
        assert {a.automargin for a in [*fig.select_xaxes(), *fig.select_yaxes()]} == {False}
        ticks = [y for d in fig.data if d.type == "bar" for y in d.y]
        assert fig.layout.margin.l >= max(text_width_px(y, figures.HEAD_TICK_PX) for y in ticks)
    assert len({fig.layout.margin.l for fig in figs}) == 1
    wide = json.loads(json.dumps(run.traces[0]))
    wide["head_topk"][0][0]["text"] = "漢字" * 6
    fig = figures.head_panel(wide, [])
    assert fig.layout.margin.l >= text_width_px(fig.data[0].y[0], figures.HEAD_TICK_PX) > figs[0].layout.margin.l


def test_incremental_head_accuracy_equals_recomputation(run):
    vec = trees.rank_vectors(run.traces)
    hs = trees.head_stats(vec, 4)
    assert [h[0] for h in run.head_hits] == [c[0] for c in hs.counts]  # top-1 hits per head
    assert [h[1] for h in run.head_hits] == hs.totals
    replay = RunState(run.settings)
    for t, p in zip(run.traces, run.pieces):
        replay.add(t, p)
    assert replay.head_hits == run.head_hits


def test_other_figures(run):
    per_step = [len(t["accepted_tokens"]) for t in run.traces]
    chart = figures.run_chart(per_step, selected=2)
    assert list(chart.data[0].y) == per_step and chart.layout.shapes  # the selected step is marked
    accepted = [len(t["accepted_nodes"]) - 1 for t in run.traces]
    heat = figures.acceptance_heatmap(accepted, 4)
    assert [row[0] for row in heat.data[0].z] == [float(accepted[0] >= d) for d in range(1, 5)]
    assert figures.calibration_figure(run.traces).data
    assert figures.tree_figure(trees.preset("chain_3"), [0.5, 0.3, 0.1], "P").data


def test_stream_equals_ar_and_the_run_is_saved_and_reloadable(tabs, wb, run, demo_engine):
    ar = demo_engine.generate("def main():\n", 60, mode="ar")
    assert run.stream == ar.token_ids and "".join(run.pieces) == ar.text
    listed = [r["id"] for r in wb.store.list_runs()]
    assert run.run_id in listed
    other = wb.sessions.get("reloader")
    assert tabs.decode.load_run(other, run.run_id).startswith("loaded run")
    assert other.run.stream == run.stream and other.run.head_hits == run.head_hits
    tree_fig, head_fig, table = tabs.decode.step_view(other, 2)
    assert tree_fig.layout.title.text.startswith("step 2") and len(table) == 64 and head_fig.data


def test_each_sessions_stop_ends_only_its_own_run(tabs, wb, demo_engine):
    """Two sessions decode at once (one waits for the engine): B's Stop ends B alone, within a step;
    A's output is a solo run's."""
    a, b = wb.sessions.get("A"), wb.sessions.get("B")
    out = {}

    def go(name, session, tokens):
        out[name] = list(tabs.decode.decode(session, "import os\n", "mc_sim_7b_63", "", "medusa", "greedy", 0.7, 1.0, 0, tokens))

    ta = threading.Thread(target=go, args=("A", a, 300))
    tb = threading.Thread(target=go, args=("B", b, 300))
    ta.start()
    tb.start()
    while b.run is None or len(b.run.traces) < 3:  # B decodes once A is done with the engine
        time.sleep(0.01)
    wb.sessions.stop(b.id)
    ta.join(60)
    tb.join(60)
    assert out["A"][-1]["done"] and "stopped: length" in out["A"][-1]["stats"]
    assert "stopped by user" in out["B"][-1]["stats"] and b.run.tokens < 300
    assert a.run.stream == demo_engine.generate("import os\n", 300, mode="medusa", tree="mc_sim_7b_63").token_ids
    assert not a.stop.is_set() and not b.stop.is_set()  # each run clears its own flag


class SteppedClock:
    """The Decode tab's `time` module with a monotonic clock that moves `per_step` seconds per reading (the
    decode loop reads it once per step), so throttling is tested without depending on the machine's
    speed; everything else is the real module."""

    def __init__(self, per_step: float):
        self.now, self.per_step = 1024.0, per_step  # binary fractions: sums of readings are exact

    def monotonic(self) -> float:
        self.now += self.per_step
        return self.now

    def __getattr__(self, name):
        return getattr(time, name)


@pytest.mark.parametrize("per_step", [1 / 16, 1 / 2])
def test_streaming_is_throttled_not_resent_and_draws_no_figures(tabs, wb, monkeypatch, per_step):
    """Text updates come at most every THROTTLE_S, plus the last step's and the closing update; the text
    only grows at its end; no streamed update carries a step to draw (figures are drawn once, for the
    selected step, at the end). At 1/16 s a step that is a text update every 8th step; at 1/2 s (no
    faster than the throttle) every step."""
    from workbench.tabs import decode as decode_tab

    monkeypatch.setattr(decode_tab, "time", SteppedClock(per_step))
    session = wb.sessions.get("throttle")
    events = list(tabs.decode.decode(session, "def f(x):\n", "demo_tuned", "", "medusa", "greedy", 0.7, 1.0, 0, 200))
    steps = len(session.run.traces)
    text_every = math.ceil(decode_tab.THROTTLE_S / per_step)
    assert steps > 4 * text_every and events[-1]["done"]
    streamed = events[:-1]  # the closing update repeats the final state
    assert len(streamed) == len(range(0, steps - 1, text_every)) + 1  # every text_every-th step, and the last
    assert all(e["trace"] is None for e in streamed)
    assert events[-1]["trace"] is session.run.traces[-1]
    for a, b in zip(events, events[1:]):  # the text only grows at the end: Gradio sends the appended part
        assert b["html"].startswith(a["html"])
    assert "<span" not in events[-1]["html"]  # one text node, not a span per step


def test_saved_runs_record_their_acceptance_rule(tabs, wb):
    """The saved trace's header names the rule as the trace schema does (`acceptance`), so a typical run
    reads back as typical (and the step-start estimator treats it as one)."""
    session = wb.sessions.get("typical-saver")
    events = list(tabs.decode.decode(session, "def f(x):\n", "mc_sim_7b_63", "", "medusa", "typical", 0.8, 1.0, 0, 30))
    assert events[-1]["done"] and session.run.run_id
    path = wb.store.run_dir(session.run.run_id) / "trace.jsonl"
    (run,) = trees.read_runs(path)
    assert run.acceptance == "typical" and run.mode == "medusa" and run.n_tokens == 30
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["acceptance"] == "typical"  # the schema's name, for every trace reader
    # a run saved before the header said `acceptance` still reads as typical
    header = {k: v for k, v in json.loads(lines[0]).items() if k != "acceptance"}
    path.write_text("\n".join([json.dumps(header)] + lines[1:]) + "\n")
    assert "accept" in header and trees.read_runs(path)[0].acceptance == "typical"


def test_one_prediction_for_a_tree_everywhere_and_it_is_exact_on_its_own_prompts(tabs, wb, demo_engine):
    """Editor, Tune and the saved file give the same replayed prediction; confirmed on the very prompts
    the traces came from, prediction and measurement are equal (greedy replay is exact)."""
    session = wb.sessions.get("tuner")
    prompts = wb.prompt_set("held-out", "", None, 3)
    assert "collected" in tabs.tune.collect(session, prompts, 48)
    tree_json, msg, _ = tabs.tune.optimize_tree(session, 10, "replay")
    assert msg.startswith("✓") and len(json.loads(tree_json)) == 10
    choices = json.loads(tree_json)
    pred = wb.predict(session, choices)
    value = f"{pred.estimate.value:.3f}"
    assert value in msg and value in tabs.editor.validate_tree(tree_json, session)[0]
    saved_msg, path = tabs.editor.save_tree("tuned10", tree_json, session=session)
    assert trees.load_tree(path).expected_accepted == pytest.approx(pred.estimate.value, abs=1e-4)
    confirm = tabs.tune.confirm_tree(session, tree_json, prompts, 48)
    measured = float(re.search(r"measured ([0-9.]+) tokens/step", confirm).group(1))
    assert measured == pytest.approx(pred.estimate.value, abs=1e-3) and "+0.0 %" in confirm.replace("-0.0 %", "+0.0 %")
    assert "replay" in pred.message and "CI" in pred.message


def test_size_choice_uses_measured_step_times(tabs, wb):
    session = wb.sessions.get("sizer")
    session.latency = trees.latency_points({"points": [{"nodes": 0, "step_ms": 1.0}, {"nodes": 4, "step_ms": 1.2},
                                                       {"nodes": 16, "step_ms": 50.0}]})
    session.latency_source = "test"
    tree_json, msg, fig = tabs.tune.optimize_tree(session, 64, "replay", by_latency=True)
    assert len(json.loads(tree_json)) == 4 and "size 4 chosen" in msg and fig is not None


def test_saved_trees_are_listed_at_once_and_files_are_readable(tabs, wb):
    msg, path = tabs.editor.save_tree("listed", "[[0], [1]]")
    assert msg.startswith("✓") and "saved/listed" in wb.tree_names()
    import os
    import stat

    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert wb.resolve_choice("saved/listed", "") == [[0], [1]]


def test_handler_errors_are_messages(tabs, wb):
    s = wb.sessions.get("errors")
    assert list(tabs.decode.decode(s, "   ", "mc_sim_7b_63", "")) == [{"error": "the prompt is empty"}]
    assert "prefix [0] is missing" in list(tabs.decode.decode(s, "x", EDITOR, "[[0, 1]]"))[0]["error"]
    assert "exceeds the context" in list(tabs.decode.decode(s, "x", "mc_sim_7b_63", "", max_new_tokens=5000))[0]["error"]
    assert "limit is 20000" in list(tabs.decode.decode(s, "x" * 30000, "mc_sim_7b_63", ""))[0]["error"]
    msg, fig, normal = tabs.editor.validate_tree("{not json")
    assert msg.startswith("✗") and "not valid JSON" in msg and fig is None and normal is None
    assert "prefix [0, 0] is missing" in tabs.editor.validate_tree("[[0], [0, 0, 0]]")[0]
    assert "exceeds the 4 heads" in tabs.editor.validate_tree(json.dumps([[0]] + [[0] * d for d in range(2, 6)]))[0]
    text, msg = tabs.editor.edit_tree("[[0]]", "add child", "[0]", 1)
    assert json.loads(text) == [[0], [0, 1]] and "added" in msg
    assert tabs.editor.edit_tree("[[0]]", "delete subtree", "[0]", 0)[1].startswith("✗ that would leave an empty tree")
    assert tabs.editor.export_tree("[[0], [0, 0]]", "vllm") == ("[(0,), (0, 0)]", "")
    # a tree the target will not keep as it is exports, with the target's limits named beside the text
    text, warn = tabs.editor.export_tree("[[0], [2]]", "trtllm")
    assert text == trees.to_trtllm([[0], [2]]) and warn.startswith("⚠ depth-1 ranks [0, 2] are not 0..1")
    text, warn = tabs.editor.export_tree("[[0], [1]]", "vllm")
    assert text == "[(0,), (1,)]" and "drafts each head's top-1" in warn
    assert tabs.editor.export_tree("[[0], [2]]", "json") == ("[[0], [2]]", "")
    assert "added 1" in tabs.editor.diff_trees("chain_1", "chain_2", "")
    # counts are never truncated: 2.5 prompts, 12.5 nodes or rank 1.5 is an error, not 2, 12 or 1
    with pytest.raises(UserError, match="number of prompts must be a whole number"):
        wb.prompt_set("held-out", "", None, 2.5)
    assert len(wb.prompt_set("held-out", "", None, 2.0)) == 2
    assert s.pool and "nodes must be a whole number" in tabs.tune.optimize_tree(s, 12.5, "replay")[1]
    assert "rank must be a whole number" in tabs.editor.edit_tree("[[0]]", "add child", "[0]", 1.5)[1]


def test_app_over_gradio_client_with_defaults(wb):
    """The README's three lines (a prompt and nothing else), every named endpoint, and nothing else
    in the API."""
    from gradio_client import Client

    from workbench.app import serve

    app, url = serve(wb, block=False)
    try:
        readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
        example = readme.split("### API", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
        assert example.count("\n") == 3 and 'Client("http://127.0.0.1:7860/")' in example
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(example.replace("http://127.0.0.1:7860/", url), {})
        out = Client(url, verbose=False).predict("def read_config(path):", api_name="/generate")
        assert printed.getvalue().endswith("\n" + out["text"] + "\n") and out["text"].strip()  # after "Loaded as API"
        client = Client(url, verbose=False)
        out = client.predict("import os\n", api_name="/generate")
        assert len(out["token_ids"]) == 64 and out["finish_reason"] in ("length", "eos")
        api = client.view_api(return_format="dict", print_info=False)
        assert set(api["named_endpoints"]) == {"/generate", "/validate_tree", "/optimize_tree"}
        assert api["unnamed_endpoints"] == {}
        v = client.predict("[[1, 0]]", api_name="/validate_tree")
        assert v["valid"] is False and "prefix [1] is missing" in v["message"] and v["tree"] is None
        assert client.predict("[[1], [0]]", api_name="/validate_tree")["tree"] == [[0], [1]]
        opt = client.predict(8, "replay", api_name="/optimize_tree")
        assert len(opt["tree"]) == 8
        same = client.predict("import os\n", "[[0], [0, 0]]", api_name="/generate")
        assert same["token_ids"] == out["token_ids"]  # a tree given as JSON: the same greedy output
        s1 = client.predict("import os\n", "demo_tuned", "ar", "sample", 1.0, 1.0, 1, 24, api_name="/generate")
        s2 = client.predict("import os\n", "demo_tuned", "ar", "sample", 1.0, 1.0, 2, 24, api_name="/generate")
        assert s1["token_ids"] != s2["token_ids"]  # the seed reaches the sampler
        assert client.predict("", api_name="/generate") == {"error": "the prompt is empty"}
        assert client.predict("import os\n", model="gpt-5", api_name="/generate")["error"].startswith(
            "unknown model 'gpt-5': this app offers demo")
    finally:
        app.close()


def test_rule_comparison_has_a_row_per_registered_rule(tabs, wb):
    from engine.accept import RULES

    session = wb.sessions.get("rules")
    rows, msg = tabs.compare.compare_rules(session, "chain_2", "", wb.prompt_set("pasted", "def f(x):", None, 1), 0.8, 1,
                                           max_new_tokens=8)
    assert [r[0] for r in rows] == [*RULES, "AR vs AR"] and "T = 0.8" in msg
    assert [r[1] for r in rows[:-1]] == [rule.lossless for rule in RULES.values()]
    assert all(r[2] >= 1 for r in rows[:-1]) and all(0 <= r[3] <= 1 for r in rows)


def test_a_new_tab_is_one_new_file(wb, tmp_path, monkeypatch):
    """A module dropped into workbench/tabs/ with a TAB is on the page at its order, with its page-load
    updates, and nothing else is edited (the tab modules are found, not listed)."""
    import shutil
    from types import SimpleNamespace

    import workbench.tabs
    from workbench.app import build_app
    from workbench.tabs import tab_classes

    before = tab_classes()
    assert len(before) >= 5 and [c.order for c in before] == sorted(c.order for c in before)
    folder = tmp_path / "tabs"
    shutil.copytree(Path(workbench.tabs.__file__).parent, folder)
    (folder / "notes.py").write_text(
        "import gradio as gr\n\n\nclass NotesTab:\n    title = 'Notes'\n    order = 25\n\n"
        "    def __init__(self, wb):\n        self.wb = wb\n\n"
        "    def layout(self, page):\n        self.box = gr.Markdown(elem_id='notes')\n\n"
        "    def wire(self, page):\n        pass\n\n"
        "    def load_outputs(self):\n        return [self.box]\n\n"
        "    def on_load(self, session, editor_text):\n        return {self.box: 'notes for ' + str(len(editor_text))}\n\n\n"
        "TAB = NotesTab\n")
    monkeypatch.setattr(workbench.tabs, "__path__", [str(folder)])
    names = [cls.title for cls in tab_classes()]
    assert names == [c.title for c in before if c.order < 25] + ["Notes"] + [c.title for c in before if c.order > 25]
    app = build_app(wb)
    assert [b.label for b in app.blocks.values() if type(b).__name__ == "Tab"] == names
    load = next(fn for fn in app.fns.values() if fn.name == "on_load")
    notes = next(o for o in load.outputs if getattr(o, "elem_id", None) == "notes")
    updates = load.fn("[[0], [1]]", SimpleNamespace(session_hash="new-tab"))
    assert updates[notes] == "notes for 10" and set(updates) <= set(load.outputs)
