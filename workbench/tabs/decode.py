"""Decode: one streamed run per session, its step tree, head panel, node table and run figures, the
step scrubber and playback, downloads, and the saved runs."""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack

import gradio as gr

import trees
from engine import Engine, GenerationError
from engine.trace import prompt_hash

from .. import figures
from ..core import EDITOR, MAX_PROMPT_CHARS, MODEL_TREE, Workbench
from ..memory import on_one_thread
from ..page import ACCEPT_CHOICES, PRIVATE, Page
from ..plotzoom import warmup_plot, zoomable
from ..runtext import CLICK_JS, text_html
from ..session import RunState, Session, UserError, step_index, step_problem, user_message
from ..store import StoreError

log = logging.getLogger("workbench")
# streamed text and stats: at most two updates a second, whatever the step rate. Each update costs the page work
# that does not shrink with its size (Gradio looks up and snapshots every output, the HTML component parses and
# merges its whole text again), on the CPU the decode shares on a small machine
THROTTLE_S = 0.5
TABLE_HEADERS = ["node", "path", "token", "head p", "path p", "status", "why"]
FIGURE_NAMES = ("step_tree", "heads", "run", "acceptance", "calibration")
FAILED = "✗ "  # how the stats line starts when a run did not happen (then no figures follow)
# The stats line from the click to the run's first update (the run may wait in the queue behind other pages' runs).
# Gradio's own progress display is hidden on the stream: its timer and animated borders kept the page's main
# thread 30 % busier through a run (benchmarks/page_ab.py), on the CPU the decode shares on a small machine
WAITING = "⏳ waiting for the engine…"
TOKEN_CHARS = 40  # the node table's token column: long tokens are cut, with '…'
# Every event that draws a step's figures takes its turn in this group of one, so figures land in the order their
# events were triggered and the last one shows what the controls say now. Side by side, a view change made as a run
# ends was drawn before the run's slower closing figures, which then replaced it with the view they were sent.
FIGURES_QUEUE = "decode-figures"
DRAWS = dict(concurrency_limit=1, concurrency_id=FIGURES_QUEUE, **PRIVATE)


def internal_error(what: str, e: Exception) -> str:
    """A bug's one line for the page (not bad input: that has its own message), its traceback logged."""
    log.exception(what)
    return f"internal error ({type(e).__name__}: {e}); the app is still running"


def reported(handler):
    """A figure event's handler whose unexpected exception is logged and shown as one line. These events
    report their status on a hidden component and the app serves with Gradio's show_error off, so an
    exception would otherwise leave no sign on the page."""
    @functools.wraps(handler)  # Gradio reads the handler's signature (its gr.Request argument) and name
    def run(*args, **kwargs):
        try:
            return handler(*args, **kwargs)
        except gr.Error:
            raise
        except Exception as e:  # a bug, not bad input: say so, log the traceback, keep serving
            raise gr.Error(internal_error("drawing failed", e), print_exception=False) from None
    return run


def tree_view(session: Session, prune_v, show, collapsed) -> figures.TreeView:
    """The view a Decode draw uses: prune and show-every-node as the user last set them, when they have
    (a draw can run after a later input than the one whose values it was sent with: the run's closing
    figures, sent as the run ended, drew the tree collapsed again after "show every node" was ticked),
    else as sent; the collapse list as sent."""
    if session.tree_view is not None:
        prune_v, show = session.tree_view
    try:
        paths = frozenset(tuple(json.loads(c)) for c in (collapsed or []))
    except (ValueError, TypeError):
        paths = frozenset()
    return figures.TreeView(float(prune_v or 0), bool(show), paths)


def example_prompt() -> str:
    """The README's CLI prompt, so the app and `python -m engine generate` start in the same place."""
    return "def read_config(path):"


class DecodeTab:
    title = "Decode"
    order = 10

    def __init__(self, wb: Workbench):
        self.wb = wb

    # -- what the events do ------------------------------------------------------------------------
    def decode(self, session: Session, prompt: object, tree_choice: object, editor_text: object, mode: object = "medusa",
               accept: object = "greedy", temperature: object = 0.7, top_p: object = 1.0, seed: object = 0,
               max_new_tokens: object = 96) -> Iterator[dict]:
        """Stream one run for one session. Yields small updates, throttled: {"html": the text so far
        (Gradio sends only what was appended), "stats", "steps", "trace" (None while streaming: the
        figures are drawn for the selected step, never for every streamed one), "done"}, the last one
        with "trace" (the last step) and "run"; or {"error": message} once. The session's Stop (or its
        client leaving) ends the run after the step in flight."""
        try:
            prompt = self.wb.check_prompt(prompt)
            tree = self.wb.resolve_choice(tree_choice, editor_text, session) if mode == "medusa" else None
            cfg = self.wb.config(mode, tree, accept, temperature, top_p, seed, max_new_tokens, session=session)
            self.wb.engine_of(session)  # the session's model loads now: one that cannot is a message
        except UserError as e:
            yield {"error": str(e)}
            return
        with ExitStack() as held:
            try:  # the model can be let go (or fail to load again) between the check above and the job
                engine = held.enter_context(self.wb.job(session))
            except UserError as e:
                yield {"error": str(e)}
                return
            if session.stop.is_set():  # Stop was pressed before this run left the queue
                yield {"error": "stopped by user before the run started"}
                return
            try:
                chat = engine.resolved(cfg).chat
                settings = {"prompt": prompt, "mode": cfg.mode, "tree": tree, "accept": cfg.accept,
                            "temperature": cfg.temperature, "top_p": cfg.top_p, "seed": cfg.seed,
                            "max_new_tokens": cfg.max_new_tokens, "model": self.wb.model_of(session), "chat": chat,
                            "prompt_sha256": prompt_hash(engine.encode(prompt, chat=chat))}
                run = session.run = RunState(settings)
                yield from self._steps(engine, session, run, prompt, cfg)
            except (GenerationError, trees.TreeError) as e:
                yield {"error": user_message(e)}
                return
            except Exception as e:  # a bug, not bad input: say so, log the traceback, keep serving
                yield {"error": internal_error("decode failed", e)}
                return
            if run.traces:
                try:
                    run.run_id = self.wb.store.save_run(settings, run.traces, "".join(run.pieces), run.finish)
                except StoreError as e:
                    run.save_error = user_message(e)
            final = {"html": text_html(run.text, run.ends), "stats": run.stats(), "steps": len(run.traces),
                     "trace": run.traces[-1] if run.traces else None, "done": True, "run": run}
        yield final  # after the job has ended: a Generate pressed as soon as the page shows the end is a new job

    def _steps(self, engine: Engine, session: Session, run: RunState, prompt: str, cfg) -> Iterator[dict]:
        t0 = time.perf_counter()
        last = 0.0
        events = engine.stream(prompt, config=cfg)
        try:
            for ev in on_one_thread(events):  # MKL's buffers once, not per Gradio worker (memory.py)
                if ev.trace is not None:
                    run.add(ev.trace, ev.text)
                run.wall_s = time.perf_counter() - t0
                if ev.done:
                    run.finish = ev.finish_reason
                if session.stop.is_set():  # say so at once; saving and the last figures follow
                    run.finish = "user"
                    yield self._update(run)
                    return
                now = time.monotonic()
                if ev.done or now - last >= THROTTLE_S:
                    yield self._update(run)
                    last = now
        finally:
            events.close()  # an abandoned stream (client gone) still finishes the engine's step in flight

    @staticmethod
    def _update(run: RunState) -> dict:
        return {"html": text_html(run.text, run.ends), "stats": run.stats(), "steps": len(run.traces), "trace": None,
                "done": False}

    def step_view(self, session: Session, step: object, view: figures.TreeView = figures.TreeView()):
        """(tree figure, head panel, node table rows) of one step of the session's run; (None, None, [])
        when there is no run or `step` is not a number."""
        run = session.run
        i = step_index(step, len(run.traces)) if run is not None else None
        if i is None:
            return None, None, []
        return figures.step_tree_figure(run.traces[i], view), self.head_figure(run, i), self.table_rows(run.traces[i])

    @staticmethod
    def table_rows(trace: dict) -> list[list]:
        """The node table's rows for one step (tokens shown as in the tree, cut at TOKEN_CHARS)."""
        return [[r["node"], json.dumps(r["path"]), figures.token_label(r["token_text"], TOKEN_CHARS), r["head_prob"],
                 r["path_prob"], r["status"], r["why"]] for r in figures.node_rows(trace)]

    @staticmethod
    def head_figure(run: RunState, i: int):
        """Step i's head panel, with each head's top-1 accuracy as it stood at that step."""
        return figures.head_panel(run.traces[i], figures.next_tokens(run.traces, i), run.head_hits_until(i))

    @staticmethod
    def tree_drawing(session: Session, step: object, view: figures.TreeView):
        """The step tree as the page gets it (the wheel zooms it, and the zoom stays from step to step), or
        None when there is no such step or when the page shows exactly this drawing already: a run's end
        empties the collapse list, whose change event drew the tree the closing figures had just drawn
        (a 255-node tree is one of the page's costliest draws)."""
        run = session.run
        i = step_index(step, len(run.traces)) if run is not None else None
        if i is None:
            return None
        drawn = session.tree_drawn
        if drawn is not None and drawn[0] is run and drawn[1:] == (i, view):
            return None
        session.tree_drawn = (run, i, view)
        return zoomable(figures.step_tree_figure(run.traces[i], view), f"tree-{len(run.traces[0]['tree'])}")

    @staticmethod
    def run_chart(run: RunState | None, selected: int | None = None):
        """Tokens per step over the run, `selected` marked; None without steps."""
        if run is None or not run.traces:
            return None
        return figures.run_chart([len(t["accepted_tokens"]) for t in run.traces], selected)

    def run_figures(self, session: Session, selected: int | None = None):
        """(run chart, acceptance heatmap, calibration) of the session's run."""
        run = session.run
        if run is None or not run.traces:
            return None, None, None
        depth = max((len(p) for p in run.traces[0]["tree"]), default=0)
        accepted = [len(t["accepted_nodes"]) - 1 for t in run.traces]
        return (self.run_chart(run, selected), figures.acceptance_heatmap(accepted, depth) if depth else None,
                figures.calibration_figure(run.traces))

    def select(self, session: Session, step: object, view: figures.TreeView):
        """Everything that shows one step: (tree, heads, table, run chart, text, step) or None; the tree is
        None when the page shows it already."""
        run = session.run
        i = step_index(step, len(run.traces)) if run is not None else None
        if i is None:
            return None
        return (self.tree_drawing(session, i, view), self.head_figure(run, i), self.table_rows(run.traces[i]),
                self.run_chart(run, i), text_html(run.text, run.ends, i), i)

    def load_run(self, session: Session, run_id: object) -> str:
        try:
            summary, steps = self.wb.store.load_run(str(run_id or ""))
        except (StoreError, trees.TraceError, OSError, ValueError) as e:
            return f"✗ {user_message(e)}"
        problem = next((p for p in map(step_problem, steps) if p is not None), None)
        if problem is not None:
            return f"✗ run {summary['id']} is damaged: {problem}"
        run = RunState(summary["settings"], run_id=summary["id"], finish=summary.get("finish") or "length")
        try:
            for s in steps:
                run.add(s, s.get("accepted_text", ""))
        except (KeyError, TypeError, IndexError) as e:
            return f"✗ run {summary['id']} is damaged: a step lacks {user_message(e)}"
        session.run = run
        return f"loaded run {summary['id']}: {run.stats()}"

    def tree_choice_of(self, tree: list | None) -> tuple[str, str | None]:
        """(tree dropdown value, editor text or None) that give back `tree`: the first named tree with
        exactly these nodes, else the tree in the editor."""
        if not tree:
            return trees.DEFAULT_TREE, None
        want = [list(p) for p in tree]
        for name in self.wb.tree_names():
            if name == EDITOR:
                continue
            try:
                if [list(p) for p in self.wb.resolve_choice(name, None)] == want:
                    return name, None
            except (UserError, trees.TreeError, StoreError, OSError, ValueError):
                continue
        return EDITOR, json.dumps(want)

    def restored_controls(self, run: RunState) -> dict:
        """The controls' values that repeat `run` (a loaded run shows its prompt, tree and settings, so
        Generate runs it again): {prompt, tree, editor (None: leave the editor), mode, accept,
        temperature, top_p, seed, max_new_tokens}."""
        st = run.settings
        tree, editor_text = self.tree_choice_of(st.get("tree"))
        return {"prompt": st.get("prompt", ""), "tree": tree, "editor": editor_text, "mode": st.get("mode", "medusa"),
                "accept": st.get("accept", "greedy"), "temperature": st.get("temperature", 0.7),
                "top_p": st.get("top_p", 1.0), "seed": st.get("seed") or 0,
                "max_new_tokens": st.get("max_new_tokens", run.tokens)}

    # -- playback: the timer advances the step while the session's `playing` is on -----------------
    @staticmethod
    def play(session: Session, label: object) -> tuple[str, bool]:
        """The play/pause button: (its new label, timer active). The session's flag changes at once, so
        a tick already in flight when Pause is pressed does nothing."""
        session.playing = str(label).startswith("▶")
        return ("⏸ pause" if session.playing else "▶ play"), session.playing

    @staticmethod
    def tick_step(session: Session, step: object) -> int | None:
        """The step a timer tick moves to (wrapping at the end), or None: paused, or nothing to play.
        Ticks never switch the timer on; only `play` does."""
        run = session.run
        i = step_index(step, len(run.traces)) if run is not None else None
        if not session.playing or i is None:
            return None
        return (i + 1) % len(run.traces)

    def run_choices(self) -> list[tuple[str, str]]:
        out = []
        for r in self.wb.store.list_runs():
            s = r["settings"]
            label = (f"{r['created']} · {s.get('mode')} {len(s.get('tree') or [])} nodes · {r['tokens']} tok, "
                     f"{r['tokens_per_step']}/step · {str(s.get('prompt', ''))[:30]!r}")
            out.append((label, r["id"]))
        return out

    def runs_note(self) -> str:
        """What the runs list left out (damaged folders), for the message under it."""
        bad = self.wb.store.damaged_runs
        return f"{len(bad)} damaged run folder(s) skipped: {', '.join(bad[:5])}" if bad else ""

    @staticmethod
    def collapse_choices(session: Session) -> list[str]:
        run = session.run
        if run is None or not run.traces:
            return []
        tree = run.traces[0]["tree"]
        return [json.dumps(p) for p in tree if len(p) < max(len(q) for q in tree)]

    # -- the page ----------------------------------------------------------------------------------
    def layout(self, page: Page) -> None:
        eng = self.wb.engine
        max_tokens = max(1, min(2048, eng.max_seq_len - 16))
        with gr.Row():
            with gr.Column(scale=3):
                self.prompt = gr.Textbox(label="prompt", value=example_prompt(), lines=5, max_length=MAX_PROMPT_CHARS)
                with gr.Row():
                    self.run_btn = gr.Button("Generate", variant="primary")
                    self.stop_btn = gr.Button("Stop", variant="stop")
                self.stats = gr.Markdown("no run yet", elem_id="stats")
            with gr.Column(scale=2):
                self.tree = page.tree_dropdown("tree", MODEL_TREE)
                with gr.Row():
                    self.mode = gr.Radio(["medusa", "ar"], value="medusa", label="mode")
                    self.accept = gr.Radio(ACCEPT_CHOICES, value="greedy", label="acceptance",
                                           info="greedy and sample are lossless; typical is not")
                with gr.Row():
                    self.temperature = gr.Slider(0, 2, value=0.7, step=0.05, label="temperature (typical / sample)")
                    self.top_p = gr.Slider(0.05, 1, value=1.0, step=0.05, label="top-p")
                with gr.Row():
                    self.seed = gr.Number(value=0, precision=0, label="seed", minimum=0)
                    self.max_new = gr.Slider(1, max_tokens, value=96, step=1, label="max new tokens")
        self.out_html = gr.HTML("", html_template="<pre class='out'>${value}</pre>", js_on_load=CLICK_JS,
                                label="output (click anywhere in the text to select the step that wrote it)",
                                elem_id="out-text")
        with gr.Row():
            self.step = gr.Slider(0, 1, value=0, step=1, label="step", scale=5, elem_id="step-slider")
            self.play_btn = gr.Button("▶ play", scale=1)
        self.timer = gr.Timer(0.6, active=False)
        with gr.Row():
            self.prune = gr.Slider(0, 0.5, value=0.02, step=0.005, label="prune: hide nodes whose path probability is below",
                                   info="the accepted path and its siblings always stay", scale=3, elem_id="prune")
            self.show_all = gr.Checkbox(False, label="show every node", scale=1, elem_id="show-all")
            self.collapse = gr.Dropdown([], value=[], multiselect=True, label="collapse subtrees (node paths)", scale=3,
                                        elem_id="collapse")
        gr.Markdown("**Step tree**: drag to pan, box or scroll to zoom, hover any node; orange rings show the "
                    "target's own token where the drafted children missed it.")
        self.tree_plot = gr.Plot(show_label=False, elem_id="tree-plot")
        with gr.Row():
            self.head_plot = gr.Plot(show_label=False, elem_id="head-plot")
            with gr.Column():
                self.node_table = gr.Dataframe(headers=TABLE_HEADERS, label="this step's nodes", interactive=False,
                                               max_height=520, elem_id="node-table")
                self.table_csv, self.table_json = page.download_buttons("nodes")  # files: `table_out` in wire
        with gr.Row():
            self.run_plot = gr.Plot(show_label=False, elem_id="run-plot")
            self.heat_plot = gr.Plot(show_label=False, elem_id="heat-plot")
        with gr.Accordion("calibration, downloads and saved runs", open=False):
            self.calib_plot = gr.Plot(show_label=False, elem_id="calib-plot")
            self.fig_btn = page.figure_exports(dict(zip(FIGURE_NAMES, [self.tree_plot, self.head_plot, self.run_plot,
                                                                       self.heat_plot, self.calib_plot])), "decode")
            with gr.Row():
                self.runs_pick = gr.Dropdown([], label="saved runs (newest first)", scale=4)
                self.load_run_btn = gr.Button("Load run", scale=1)
                self.run_files = gr.File(label="run files (trace JSONL + settings)", file_count="multiple", scale=3)
            self.runs_msg = gr.Markdown()
        warmup_plot()  # Plotly's first draws happen as the page loads, not when a run ends

    def wire(self, page: Page) -> None:
        skip = gr.update()
        # Every event of a decode is quiet (`Page.quiet`): a 255-node tree's figure and node table, as progress
        # targets, were cloned over and over at a run's end, in the page's longest tasks.
        draws = dict(DRAWS, **page.quiet)
        view_in = [self.prune, self.show_all, self.collapse]
        # a run's end and a loaded run empty the collapse list (the new tree has its own nodes) and draw their
        # figures with nothing collapsed: they read the other view controls only
        fresh_view_in = [self.prune, self.show_all]

        def table_out(rows: list[list]) -> tuple:
            """The node table's rows and its download files, written by the event that draws the table (a
            change event would make the 255-row table one of the page's loading statuses, `Page.table_downloads`)."""
            return (rows, *page.table_files("nodes", TABLE_HEADERS, rows))

        def decode_stream(prompt, tree_choice, editor_text, mode, accept, temperature, top_p, seed, max_new,
                          request: gr.Request):
            session = page.session(request)
            for ev in self.decode(session, prompt, tree_choice, editor_text, mode, accept, temperature, top_p, seed,
                                  max_new):
                if "error" in ev:
                    yield f"{FAILED}{ev['error']}", skip, skip
                    return
                last = max(0, ev["steps"] - 1)
                yield ev["stats"], ev["html"], gr.update(maximum=max(1, last), value=last)

        def ended(stats, request: gr.Request) -> tuple[Session, RunState] | None:
            """(session, run) when the run that just ended has steps to draw."""
            session = page.session(request)
            run = session.run
            if str(stats).startswith(FAILED) or run is None or not run.traces:
                return None
            return session, run

        # The run's end, as a chain of small events in the figures' group: each is one message, and so one task
        # on the page's main thread, where all six figures in one message made the page's longest task.
        # The stream itself carries only the text, the stats and the step (its completion message repeats them).
        def closing_tree(stats, prune_v, show, request: gr.Request):
            """The last step's tree and node table, and the new tree's nodes in the collapse list."""
            got = ended(stats, request)
            if got is None:
                return (skip,) * 5
            session, run = got
            last = len(run.traces) - 1
            tree_fig = self.tree_drawing(session, last, tree_view(session, prune_v, show, None))
            return (skip if tree_fig is None else tree_fig, *table_out(self.table_rows(run.traces[last])),
                    gr.update(choices=self.collapse_choices(session), value=[]))

        def closing_heads(stats, request: gr.Request):
            got = ended(stats, request)
            return skip if got is None else self.head_figure(got[1], len(got[1].traces) - 1)

        def closing_run(stats, request: gr.Request):
            """The run chart and the acceptance heatmap; the calibration (in a closed accordion) and the
            saved runs' list come last."""
            got = ended(stats, request)
            if got is None:
                return skip, skip
            run_fig, heat_fig, _ = self.run_figures(got[0], len(got[1].traces) - 1)
            return run_fig, skip if heat_fig is None else heat_fig

        def closing_saved(stats, request: gr.Request):
            got = ended(stats, request)
            if got is None:
                return skip, skip, skip
            run = got[1]
            return (figures.calibration_figure(run.traces), gr.update(choices=self.run_choices()),
                    f"saved as run {run.run_id}" if run.run_id else self.runs_note())

        job = page.job(self.run_btn, decode_stream, [self.prompt, self.tree, page.editor, self.mode, self.accept,
                                                     self.temperature, self.top_p, self.seed, self.max_new],
                       [self.stats, self.out_html, self.step], begun=WAITING, **page.quiet)
        (job.then(reported(closing_tree), [self.stats] + fresh_view_in,
                  [self.tree_plot, self.node_table, self.table_csv, self.table_json, self.collapse], **draws)
            .then(reported(closing_heads), self.stats, self.head_plot, **draws)
            .then(reported(closing_run), self.stats, [self.run_plot, self.heat_plot], **draws)
            .then(reported(closing_saved), self.stats, [self.calib_plot, self.runs_pick, self.runs_msg], **draws))
        page.stop_button(self.stop_btn, self.stats)

        select_out = [self.tree_plot, self.head_plot, self.node_table, self.table_csv, self.table_json, self.run_plot,
                      self.out_html, self.step]

        def select(s, prune_v, show, collapsed, request: gr.Request):
            session = page.session(request)
            shown = self.select(session, s, tree_view(session, prune_v, show, collapsed))
            if shown is None:
                return (skip,) * len(select_out)
            tree_fig, head_fig, rows, run_fig, html, i = (skip if v is None else v for v in shown)
            return tree_fig, head_fig, *table_out(rows), run_fig, html, gr.update(value=i)

        self.step.release(reported(select), [self.step] + view_in, select_out, **draws)

        def clicked_text(prune_v, show, collapsed, evt: gr.EventData, request: gr.Request):
            data = getattr(evt, "_data", None)
            run = page.session(request).run
            step = run.step_at(data.get("offset")) if isinstance(data, dict) and run is not None else None
            return select(step, prune_v, show, collapsed, request)

        self.out_html.click(reported(clicked_text), view_in, select_out, **draws)

        def redraw(s, prune_v, show, collapsed, request: gr.Request):
            session = page.session(request)
            tree_fig = self.tree_drawing(session, s, tree_view(session, prune_v, show, collapsed))
            return skip if tree_fig is None else tree_fig

        def view_input(s, prune_v, show, collapsed, request: gr.Request):
            """A user's prune or show-every-node input: remembered as the view every later draw uses."""
            page.session(request).tree_view = (float(prune_v or 0), bool(show))
            return redraw(s, prune_v, show, collapsed, request)

        # a user's input, not any change: a value the server sets draws nothing; always_last: the last value of a
        # drag or of quick toggles is drawn (input's default, "once", drops inputs that come while one is drawn)
        for c in (self.prune, self.show_all):
            c.input(reported(view_input), [self.step] + view_in, self.tree_plot, trigger_mode="always_last", **draws)
        # the collapse list on change: its clear button and Backspace send no input event. A run's end empties it
        # and so draws the tree once more, queued before the closing figures in the same group
        self.collapse.change(reported(redraw), [self.step] + view_in, self.tree_plot, trigger_mode="always_last", **draws)

        def toggle_play(label, request: gr.Request):
            label, active = self.play(page.session(request), label)
            return gr.update(value=label), gr.Timer(active=active)

        self.play_btn.click(toggle_play, self.play_btn, [self.play_btn, self.timer], queue=False, **PRIVATE)

        def tick(s, prune_v, show, collapsed, request: gr.Request):
            nxt = self.tick_step(page.session(request), s)
            if nxt is None:  # paused (a tick that was in flight) or nothing to play: stop, never re-arm
                return (skip,) * len(select_out) + (gr.update(value="▶ play"), gr.Timer(active=False))
            return select(nxt, prune_v, show, collapsed, request) + (skip, skip)

        self.timer.tick(reported(tick), [self.step] + view_in, select_out + [self.play_btn, self.timer], **draws)

        restore_out = [self.prompt, self.tree, page.editor, self.mode, self.accept, self.temperature, self.top_p,
                       self.seed, self.max_new]

        def load_run(run_id, prune_v, show, request: gr.Request):
            session = page.session(request)
            msg = self.load_run(session, run_id)
            run = session.run
            if msg.startswith("✗") or run is None:
                return (msg,) + (skip,) * (13 + len(restore_out))
            last = len(run.traces) - 1
            tree_fig = self.tree_drawing(session, last, tree_view(session, prune_v, show, None))
            head_fig, table = self.head_figure(run, last), self.table_rows(run.traces[last])
            run_fig, heat_fig, calib_fig = self.run_figures(session, last)
            d = self.wb.store.run_dir(run.run_id)
            c = self.restored_controls(run)
            controls = (c["prompt"], c["tree"], skip if c["editor"] is None else c["editor"], c["mode"], c["accept"],
                        c["temperature"], c["top_p"], c["seed"], c["max_new_tokens"])
            return (msg, text_html(run.text, run.ends, last), gr.update(maximum=max(1, last), value=last), tree_fig,
                    head_fig, *table_out(table), run_fig, heat_fig, calib_fig, [str(d / "trace.jsonl"), str(d / "settings.json")],
                    run.stats(), gr.update(choices=self.collapse_choices(session), value=[])) + controls

        self.load_run_btn.click(reported(load_run), [self.runs_pick] + fresh_view_in,
                                [self.runs_msg, self.out_html, self.step, self.tree_plot, self.head_plot, self.node_table,
                                 self.table_csv, self.table_json, self.run_plot, self.heat_plot, self.calib_plot,
                                 self.run_files, self.stats, self.collapse] + restore_out, **draws)

    def load_outputs(self) -> list:
        return [self.runs_pick, self.runs_msg]

    def on_load(self, session: Session, editor_text: str) -> dict:
        """The saved runs' list and note when a page opens."""
        return {self.runs_pick: gr.update(choices=self.run_choices()), self.runs_msg: self.runs_note()}


TAB = DecodeTab
