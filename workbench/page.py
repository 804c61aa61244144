"""What the tabs of the page share in Gradio: the session of an event, job buttons in the engine's
queue with their Stop, the editor's tree, and the tree dropdowns every save refreshes.

A tab builds its components in `layout(page)` and wires its events in `wire(page)` (after every tab
is laid out, so a tab may read another's components, e.g. the editor's tree). Events are private:
only `workbench/api.py` names endpoints.
"""

from __future__ import annotations

from collections.abc import Callable

import gradio as gr

from engine.accept import RULES

from . import exports
from .core import Workbench

ENGINE_QUEUE = "engine"  # every event that decodes shares this concurrency group of one
PRIVATE = dict(api_visibility="private")
STOPPED_QUEUED = "✗ stopped by user before the run started"
BUSY = "this page already has a job queued or running: wait for it to end, or press Stop"
# the acceptance radios list the registry (engine.accept.RULES), so a rule added there appears in every tab
ACCEPT_CHOICES = [(rule.label, name) for name, rule in RULES.items()]  # (label shown, value sent)
# In the page's <head>: `structuredClone` returns a primitive as it is, without the native call. At every
# status message of any event Gradio 6.31 sets the loading status of every component that ever had one, and
# each such update snapshots the component's props with Svelte 5's `$state.snapshot`, which sends every
# string, number and boolean it reaches through `structuredClone` (Svelte's shared/clone.js): 250,000 calls
# in one 1,000-token decode at 255 nodes, nearly all on primitives, for which the clone is the value itself.
CLONE_JS = """<script>
(() => {
  const clone = window.structuredClone;
  window.structuredClone = function (value) {
    const t = typeof value;
    if (arguments.length === 1 && (value === null || t === 'string' || t === 'number' || t === 'boolean' ||
                                   t === 'undefined' || t === 'bigint'))
      return value;  // no argument, or options (a transfer list), go to the native function as they are
    return clone.apply(window, arguments);
  };
})();
</script>"""


def sid(request: gr.Request | None) -> str:
    """The session hash of an event (Gradio's, per browser page or API client)."""
    return getattr(request, "session_hash", None) or "default"


class Page:
    def __init__(self, wb: Workbench):
        self.wb = wb
        self.names = wb.tree_names()
        self.editor: gr.Code | None = None  # the Tree editor tab's JSON, read by every tab
        self._dropdowns: list[tuple[gr.Dropdown, Callable[[list[str]], list[str]]]] = []
        self.status_sink: gr.Markdown | None = None  # see `quiet`

    def layout(self) -> None:
        """What the page holds for every tab: the hidden component that quiet events report to."""
        self.status_sink = gr.Markdown(visible=False, elem_id="status-sink")

    @property
    def quiet(self) -> dict:
        """An event's settings for showing no progress and reporting its loading status on one hidden
        component, not on its outputs. Gradio 6.31's page keeps a loading status for every component that
        was ever an event's progress target (its outputs, by default) and sets every one of them again at
        every status message of any event, cloning each one's whole value: each message of a decode's
        stream cloned the tree dropdowns' choices, the figures and the node table (issue 31)."""
        return dict(show_progress="hidden", show_progress_on=self.status_sink)

    def session(self, request: gr.Request | None):
        return self.wb.sessions.get(sid(request))

    def tree_dropdown(self, label: str, value: str, choices: Callable[[list[str]], list[str]] = list, **kw) -> gr.Dropdown:
        """A dropdown of trees (`choices` maps the tree names to its own list), refreshed on every save."""
        dd = gr.Dropdown(choices(self.names), value=value, label=label, **kw)
        self._dropdowns.append((dd, choices))
        return dd

    @property
    def tree_dropdowns(self) -> list[gr.Dropdown]:
        return [dd for dd, _ in self._dropdowns]

    def dropdown_updates(self) -> list:
        names = self.wb.tree_names()
        return [gr.update(choices=choices(names)) for _, choices in self._dropdowns]

    def job(self, button: gr.Button, fn: Callable, inputs: list, outputs: list, begun: str | None = None,
            **kw) -> gr.events.Dependency:
        """A button that runs an engine job: a Stop pressed earlier is forgotten at the click (at once,
        outside the engine's queue), then `fn` runs in the engine's queue. A click while this page's previous job
        is queued or running is refused with a one-line message: Gradio would drop it without a word.
        Returns the job's event, for what follows it."""
        def begin(request: gr.Request):
            if not self.wb.sessions.begin(sid(request)):
                raise gr.Error(BUSY, duration=6, print_exception=False)
            return begun

        def end(request: gr.Request) -> None:
            self.wb.sessions.end(sid(request))

        first = button.click(begin, None, outputs[0] if begun else None, trigger_mode="multiple", **PRIVATE, **self.quiet)
        job = first.success(fn, inputs, outputs, concurrency_limit=1, concurrency_id=ENGINE_QUEUE, **PRIVATE, **kw)
        job.then(end, None, None, queue=False, **PRIVATE)
        return job

    def stop_button(self, button: gr.Button, status: gr.components.Component | None = None) -> None:
        """Stop, handled at once outside the queue (it never waits for a job or for the page). With
        `status`, a job still waiting in the queue is reported stopped there and then: it would
        otherwise say so only when the jobs ahead of it had ended."""
        def stop(request: gr.Request):
            was = self.wb.sessions.stop(sid(request))
            return STOPPED_QUEUED if was == "queued" else gr.update()

        button.click(stop, None, status, queue=False, trigger_mode="multiple", **PRIVATE)

    def download(self, name: str, text: str) -> str:
        return str(self.wb.store.write_download(name, text))

    @staticmethod
    def download_buttons(stem: str) -> tuple[gr.DownloadButton, gr.DownloadButton]:
        """A table's CSV and JSON buttons (their files come from `table_files`)."""
        with gr.Row():
            return (gr.DownloadButton(f"{stem} CSV", size="sm", elem_id=f"{stem}-csv"),
                    gr.DownloadButton(f"{stem} JSON", size="sm", elem_id=f"{stem}-json"))

    def table_files(self, stem: str, headers: list[str], rows: list[list]) -> tuple:
        """The download buttons' values for a table's rows: its CSV and JSON files, written now (a click
        handler would run after the browser took the button's old file), or none for no rows."""
        if not rows:
            return gr.update(value=None), gr.update(value=None)
        a, b = self.wb.store.write_downloads({f"{stem}.csv": exports.table_csv(headers, rows),
                                              f"{stem}.json": exports.table_json(headers, rows)})
        return str(a), str(b)

    def table_downloads(self, table: gr.Dataframe, headers: list[str], stem: str) -> tuple[gr.DownloadButton, ...]:
        """CSV and JSON buttons for a table that a job sets once, written whenever the table changes. The
        change event makes the table one of the page's loading statuses from then on (an event's inputs
        join them), snapshotted at every status message: a table redrawn at every step (Decode's node
        table) writes its files in the events that draw it instead."""
        csv_btn, json_btn = self.download_buttons(stem)

        def files(value):
            cols = [str(c) for c in getattr(value, "columns", [])] or headers
            return self.table_files(stem, cols, exports.table_rows(value))

        table.change(files, table, [csv_btn, json_btn], queue=False, **PRIVATE)
        return csv_btn, json_btn

    def figure_exports(self, plots: dict[str, gr.Plot], stem: str) -> gr.Button:
        """A button that writes every figure of `plots` as SVG, print-size PNG and standalone HTML."""
        with gr.Row():
            button = gr.Button("export figures (SVG · PNG · HTML)", size="sm", elem_id=f"{stem}-export")
            out = gr.File(label="figure files", file_count="multiple", elem_id=f"{stem}-files")
        note = gr.Markdown()

        def export(*values):
            paths, notes = [], set()
            for name, value in zip(plots, values):
                fig = exports.plotly_figure(value)
                if fig is None:
                    continue
                made, why = exports.figure_files(fig)
                notes.add(why)
                paths += [str(p) for p in self.wb.store.write_downloads({f"{name}.{ext}": data
                                                                         for ext, data in made.items()})]
            if not paths:
                return None, "no figure to export yet"
            return paths, " · ".join(n for n in notes if n) or f"{len(paths)} files"

        button.click(export, list(plots.values()), [out, note], **PRIVATE)
        return button
