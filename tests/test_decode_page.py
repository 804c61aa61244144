"""The Decode tab's page-side behaviour as plain functions (issue 31): the compact text and its clicks,
the head panel at a selected step, the node table's space marker, playback that Pause stops, a run
that loads back with its controls, and a second job click that is refused aloud."""

import json
from pathlib import Path

import pytest

import trees
from workbench import figures
from workbench.core import EDITOR
from workbench.runtext import text_html
from workbench.session import RunState


@pytest.fixture(scope="module")
def session(tabs, wb):
    s = wb.sessions.get("page")
    events = list(tabs.decode.decode(s, "def main():\n", "mc_sim_7b_63", "", "medusa", "greedy", 0.7, 1.0, 3, 80))
    assert events[-1]["done"] and s.run.run_id
    return s


def test_a_character_offset_maps_to_the_step_that_wrote_it(session):
    run = session.run
    text, start = run.text, 0
    for step, piece in enumerate(run.pieces):
        for k in range(len(piece)):
            assert run.step_at(start + k) == step, (step, k)
        start += len(piece)
    assert run.step_at(len(text)) == len(run.pieces) - 1  # past the end: the last step
    assert run.step_at(float("nan")) is None and run.step_at("3") is None and RunState({}).step_at(0) is None


def test_the_text_is_one_node_with_the_selected_step_marked(session):
    run = session.run
    assert text_html("a<b & c", [3, 7]) == "a&lt;b &amp; c"  # nothing selected: escaped text, no element
    html = text_html(run.text, run.ends, 5)
    assert html.count("<") == html.count("<mark") + html.count("</mark>") == 2
    inner = html.split('data-step="5" title="step 5">')[1].split("</mark>")[0]
    assert inner == __import__("html").escape(run.pieces[5])


def test_head_accuracy_counts_only_up_to_the_selected_step(tabs, session):
    run = session.run
    assert run.head_hits_until(len(run.traces) - 1) == [tuple(h) for h in run.head_hits]
    replay = RunState(run.settings)  # what was known when step 3 was decoded
    for t, p in zip(run.traces[:4], run.pieces[:4]):
        replay.add(t, p)
    assert run.head_hits_until(3) == [tuple(h) for h in replay.head_hits]
    assert sum(t for _, t in run.head_hits_until(3)) < sum(t for _, t in run.head_hits)
    _, panel, _ = tabs.decode.step_view(session, 3)
    hits, total = run.head_hits_until(3)[0]
    assert any(f"top-1 right {hits}/{total} " in a.text for a in panel.layout.annotations)


def test_the_node_table_shows_a_space_token_visibly(tabs, session):
    run = session.run
    spaced = [(s, n) for s, tr in enumerate(run.traces) for n, t in enumerate(tr.get("node_text") or [])
              if t and t.strip() == "" and " " in t]
    assert spaced, "the fixture's greedy run drafted no all-space token: this test needs a prompt that does"
    step, node = spaced[0]
    _, _, table = tabs.decode.step_view(session, step)
    cell = table[node][2]
    assert cell.strip() and " " not in cell and cell == figures.token_label(run.traces[step]["node_text"][node], 40)


def test_pause_stops_playback_even_for_a_tick_in_flight(tabs, wb, session):
    dec = tabs.decode
    assert dec.tick_step(session, 2) is None  # not playing: a tick moves nothing
    label, active = dec.play(session, "▶ play")
    assert active and label.startswith("⏸") and dec.tick_step(session, 2) == 3
    assert dec.tick_step(session, len(session.run.traces) - 1) == 0  # wraps at the end
    label, active = dec.play(session, label)  # Pause, while a tick is in flight
    assert not active and label.startswith("▶")
    assert dec.tick_step(session, 3) is None  # the tick in flight does nothing, and re-arms nothing


def test_a_loaded_run_gives_back_its_prompt_tree_and_settings(tabs, wb, session):
    other = wb.sessions.get("loader")
    assert tabs.decode.load_run(other, session.run.run_id).startswith("loaded run")
    c = tabs.decode.restored_controls(other.run)
    assert c["prompt"] == "def main():\n" and c["tree"] == "mc_sim_7b_63" and c["editor"] is None
    assert (c["mode"], c["accept"], c["seed"], c["max_new_tokens"]) == ("medusa", "greedy", 3, 80)
    assert other.run.text == session.run.text and other.run.ends == session.run.ends
    odd = [[0], [1], [0, 0], [0, 1], [0, 0, 0]]  # no preset has exactly these nodes
    tree, editor = tabs.decode.tree_choice_of(odd)
    assert tree == EDITOR and trees.validate(__import__("json").loads(editor)) == trees.validate(odd)


@pytest.mark.parametrize("damage, named", [
    (lambda t: t.pop("tree"), "lacks 'tree'"),
    (lambda t: t.pop("accepted_text"), "lacks 'accepted_text'"),
    (lambda t: t.update(node_tokens=t["node_tokens"][:-1]), "'node_tokens' is not a list of its"),
    (lambda t: t.update(parent=None), "'parent' is not a list of its"),
    (lambda t: t.update(accepted_nodes=[0, 999]), "'accepted_nodes' names nodes outside"),
], ids=["tree", "accepted_text", "node_tokens", "parent", "accepted_nodes"])
def test_a_damaged_saved_run_is_named_when_loaded(tabs, wb, session, damage, named):
    """A saved run whose steps lack what the figures read is refused at loading with one line, not met
    later as a drawing that fails (a review found KeyError and IndexError reaching the page)."""
    traces = json.loads(json.dumps(session.run.traces))
    damage(traces[-1])
    run_id = wb.store.save_run(session.run.settings, traces, session.run.text)
    other = wb.sessions.get("damaged")
    msg = tabs.decode.load_run(other, run_id)
    assert msg.startswith(f"✗ run {run_id} is damaged: step {len(traces) - 1}") and named in msg, msg
    assert "\n" not in msg and other.run is None


def test_a_figure_event_that_fails_says_so_in_one_line(wb):
    """Every figure event reports an unexpected exception as one line (Gradio's error toast), logged with its
    traceback: their status shows on a hidden component, and the app serves with show_error off."""
    import gradio as gr

    from workbench.app import build_app
    from workbench.tabs.decode import reported

    plots = {"tree-plot", "head-plot", "run-plot", "heat-plot", "calib-plot"}
    draws = [fn for fn in build_app(wb).fns.values() if plots & {getattr(o, "elem_id", None) for o in fn.outputs}]
    assert all(getattr(fn.fn, "__wrapped__", None) is not None for fn in draws), [fn.name for fn in draws]

    def broken(step, request: gr.Request):
        return {}["missing"]

    def refused(step, request: gr.Request):
        raise gr.Error("a message for the user")

    with pytest.raises(gr.Error) as e:
        reported(broken)(3, None)
    assert e.value.message == "internal error (KeyError: 'missing'); the app is still running"
    with pytest.raises(gr.Error, match="a message for the user"):
        reported(refused)(3, None)
    assert reported(broken).__name__ == "broken" and "request" in __import__("inspect").signature(reported(broken)).parameters


def test_a_second_job_click_while_one_is_pending_is_refused(wb):
    s = wb.sessions
    assert s.begin("clicker") is True
    assert s.begin("clicker") is False  # the page says so (page.BUSY)
    assert s.begin("someone-else") is True  # per page
    s.end("clicker")
    assert s.begin("clicker") is True


def test_stop_says_at_once_when_the_job_had_not_started(wb):
    s = wb.sessions
    assert s.stop("never-clicked") == "idle"
    s.begin("queued-page")
    assert s.stop("queued-page") == "queued"  # the page shows page.STOPPED_QUEUED without waiting for the queue
    with s.job(s.get("queued-page")):
        assert s.stop("queued-page") == "running"
    s.end("queued-page")


def test_every_event_that_draws_a_steps_figures_waits_its_turn(wb):
    """The figures an event sends replace what the page shows, so the last one triggered must land last: in
    one group of one, Gradio runs them in the order they came. Side by side, a run's closing figures (slow)
    landed after a view change made as the run ended, and put the old view back. And only a user's change
    redraws: a run's end empties the collapse list, which redrew the tree its closing figures draw."""
    from workbench.app import build_app
    from workbench.tabs.decode import FIGURES_QUEUE

    drawn = {"tree-plot", "head-plot", "run-plot", "heat-plot", "calib-plot", "node-table"}  # a step's figures and table
    app = build_app(wb)
    draws = [fn for fn in app.fns.values() if drawn & {getattr(o, "elem_id", None) for o in fn.outputs}]
    names = {fn.name for fn in draws}
    assert {"closing_tree", "closing_heads", "closing_run", "closing_saved", "redraw", "view_input", "select", "tick",
            "load_run"} <= names, names
    assert [(fn.name, fn.concurrency_id, fn.concurrency_limit) for fn in draws
            if (fn.concurrency_id, fn.concurrency_limit) != (FIGURES_QUEUE, 1)] == []
    # a value the server sets draws nothing, except the collapse list (its clear button sends no input event);
    # a view control draws the last of quick inputs, not only the first
    views = {"prune", "show-all", "collapse"}
    elem = {i: getattr(block, "elem_id", None) for i, block in app.blocks.items()}  # targets name blocks by id
    on_change = [(fn.name, elem.get(target)) for fn in draws for target, event in fn.targets if event == "change"]
    assert [(name, elem) for name, elem in on_change if elem != "collapse"] == []
    redraws = [fn for fn in draws if fn.name in ("redraw", "view_input")]
    assert {elem.get(target) for fn in redraws for target, _ in fn.targets} == views
    # the user's prune and show-every-node inputs go through view_input, which remembers them for later draws
    assert {elem.get(t) for fn in redraws if fn.name == "view_input" for t, _ in fn.targets} == {"prune", "show-all"}
    assert all(fn.trigger_mode == "always_last" for fn in redraws)


def test_no_event_of_a_decode_makes_its_outputs_carry_a_loading_status(wb):
    """The page's load, the Generate click, the decode stream and the events that draw a step's figures all
    report their status on one hidden component. At every status message of any event, Gradio's page sets
    the loading status again on every component that ever had one, cloning each one's whole value: with
    the figures and the node table as progress targets (an event's outputs, by default), a 255-node tree's
    were cloned over and over at a run's end, and the page load's tree dropdowns at every message (issue 31)."""
    from workbench.app import build_app

    drawn = {"tree-plot", "head-plot", "run-plot", "heat-plot", "calib-plot", "node-table"}  # a step's figures and table
    app = build_app(wb)
    draws = [fn for fn in app.fns.values() if drawn & {getattr(o, "elem_id", None) for o in fn.outputs}]
    assert {"closing_tree", "closing_heads", "closing_run", "closing_saved", "select", "tick", "load_run"} <= \
        {fn.name for fn in draws}
    (stream,) = [fn for fn in app.fns.values() if fn.name == "decode_stream"]
    (click,) = [fn for fn in app.fns.values() if fn.name == "begin" and stream.trigger_after == fn._id]
    (opened,) = [fn for fn in app.fns.values() if fn.name == "on_load"]
    events = [*draws, stream, click, opened]
    targets = {t for fn in events for t in (fn.show_progress_on or fn.outputs)}
    assert len(targets) == 1 and not targets.pop().visible
    assert {fn.show_progress for fn in events} == {"hidden"}
    # a completed event's inputs join the page's loading statuses too: no event reads the node table (a change
    # event writing its download files did, and the 255-row table was snapshotted at every message). The figure
    # export still reads the figures it writes, so after an export they are snapshotted (not changed yet).
    readers = {fn.name for fn in app.fns.values() if drawn & {getattr(i, "elem_id", None) for i in fn.inputs}}
    assert readers <= {"export"}
    assert [fn.name for fn in app.fns.values() if "node-table" in {getattr(i, "elem_id", None) for i in fn.inputs}] == []


def test_a_draw_uses_the_view_the_user_set_last_not_the_one_it_was_sent_with():
    """A run's closing figures are sent with the view controls' values as the run ends; a user's input
    after that must win when they are drawn after it (CI once saw 41 of 255 nodes drawn after 'show
    every node' was ticked)."""
    from workbench.session import Session
    from workbench.tabs.decode import tree_view

    s = Session("view")
    assert tree_view(s, 0.05, False, ["[0]"]) == figures.TreeView(0.05, False, frozenset({(0,)}))
    s.tree_view = (0.1, True)  # what the user's last prune / show-every-node input set
    assert tree_view(s, 0.02, False, ["[0]"]) == figures.TreeView(0.1, True, frozenset({(0,)}))


def test_a_runs_end_reaches_the_page_in_small_messages(wb):
    """Each event's message is one task on the page's main thread: the stream carries only the text, the
    stats and the step (its completion message repeats them all), without Gradio's progress display (its
    timer and borders kept the page busier through the run), and the run's end draws at most two figures
    an event (all six in one message made the page's longest task, issue 31)."""
    from workbench.app import build_app

    app = build_app(wb)
    elem = lambda fn: [getattr(o, "elem_id", None) for o in fn.outputs]  # noqa: E731
    (stream,) = [fn for fn in app.fns.values() if fn.name == "decode_stream"]
    assert elem(stream) == ["stats", "out-text", "step-slider"]
    assert stream.show_progress == "hidden"
    closing = [fn for fn in app.fns.values() if fn.name.startswith("closing_")]
    assert len(closing) == 4
    assert all(sum(isinstance(o, __import__("gradio").Plot) for o in fn.outputs) <= 2 for fn in closing)


def test_the_same_tree_is_not_sent_to_the_page_twice(tabs, session):
    """A run's end empties the collapse list, and its change event asked for the tree the closing figures
    had just drawn: the same (run, step, view) gives None (nothing to send); any change draws."""
    from workbench.session import Session

    s = Session("drawn")
    s.run = session.run
    view = figures.TreeView(0.02, False, frozenset())
    assert tabs.decode.tree_drawing(s, 3, view) is not None
    assert tabs.decode.tree_drawing(s, 3, view) is None
    assert tabs.decode.tree_drawing(s, 4, view) is not None
    assert tabs.decode.tree_drawing(s, 4, figures.TreeView(0.02, True, frozenset())) is not None
    s.run = RunState(session.run.settings)  # a new run with the same steps: drawn again
    for t, p in zip(session.run.traces, session.run.pieces):
        s.run.add(t, p)
    assert tabs.decode.tree_drawing(s, 4, figures.TreeView(0.02, True, frozenset())) is not None


def test_a_runs_end_draws_every_figure_of_its_last_step(wb, session):
    """The closing events, called as the page calls them once the app is built (a method named like a
    component the layout sets would be shadowed by it): the last step's tree, table, heads, run chart,
    heatmap and calibration all come, and the saved runs' list."""
    from types import SimpleNamespace

    import gradio as gr

    from workbench.app import build_app

    app = build_app(wb)
    fns = {fn.name: fn.fn for fn in app.fns.values() if fn.name.startswith("closing_")}
    page = SimpleNamespace(session_hash=session.id)
    values = [*fns["closing_tree"]("done", 0.02, False, page), fns["closing_heads"]("done", page),
              *fns["closing_run"]("done", page), *fns["closing_saved"]("done", page)]
    tree, table, csv_file, json_file, _, heads, run_chart, heat, calib, runs_pick = values[:10]
    assert all(p is not None and not isinstance(p, dict) for p in (tree, heads, run_chart, heat, calib))
    assert len(table) == len(session.run.traces[-1]["tree"]) + 1
    # the table's download files are the table shown (written by the event that draws it)
    assert len(json.loads(Path(json_file).read_text())) == len(table)
    assert Path(csv_file).read_text().count("\n") == len(table) + 1
    assert session.run.run_id in json.dumps(runs_pick.get("choices"))
    assert fns["closing_heads"]("✗ failed", page) == gr.update()  # a failed run draws nothing


def test_a_model_let_go_between_the_check_and_the_job_is_a_message(tabs, wb, monkeypatch):
    """The session's model is checked before the run queues; if it is let go (or fails to load again) by the time
    the job takes it, the run ends with that one line, not an exception that leaves the stats line waiting."""
    from workbench.session import UserError

    def gone(name):
        raise UserError(f"model {name!r} was let go")

    monkeypatch.setattr(wb.engines, "using", gone)
    events = list(tabs.decode.decode(wb.sessions.get("evicted"), "def f():", "mc_sim_7b_63", "", "medusa", "greedy",
                                     0.7, 1.0, 0, 8))
    assert len(events) == 1 and "was let go" in events[0]["error"]
