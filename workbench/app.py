"""The Gradio app: the tabs (workbench/tabs/, one file each) and the named API over one Workbench, served
with the limits that keep a shared app healthy.

Wiring only: each tab builds and wires its own part of the page (page.py); state is per browser
session (session.py), nothing heavy lives in gr.State. Limits: request bodies (uploads and event
JSON alike) are bounded before they are read; Gradio keeps the state of at most GRADIO_SESSIONS
sessions; a session whose client goes away is stopped at once (ClientWatch), not when its run ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from urllib.parse import parse_qs

import gradio as gr

from .api import Api
from .core import Workbench
from .memory import trim_heap_periodically
from .modelbar import ModelBar
from .page import CLONE_JS, Page
from .plotzoom import PLOT_JS, WARMUP_CSS
from .session import MAX_SESSIONS
from .tabs import tab_classes
from .tabs.decode import DecodeTab
from .tabs.editor import EditorTab
from .tabs.tune import TuneTab

LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_UPLOAD = "1mb"  # per file (Gradio's check) ...
MAX_REQUEST = 2_000_000  # ... and per request body, all files together or an event's JSON (BodyLimit)
GRADIO_SESSIONS = 2 * MAX_SESSIONS  # Gradio's per-session component state (~300 KB each), least recent dropped
GRADIO_CACHE = (600, 3600)  # Gradio's copies of served files: checked every 10 min, removed after an hour
TEXT_CSS = """
pre.out { white-space: pre-wrap; font-size: 14px; line-height: 1.45; max-height: 460px; overflow-y: auto; margin: 0;
          color: var(--body-text-color); background: var(--block-background-fill); cursor: text; }
pre.out mark.sel { outline: 2px solid #ff7f0e; background: #ffe0b2; color: #1a1a1a; }
#tree-json .cm-editor, #tree-json .cm-scroller { max-height: 420px !important; min-height: 160px !important; }
#tree-json .cm-scroller { overflow-y: auto !important; }
.dark .js-plotly-plot .main-svg { background: transparent !important; }
.dark .js-plotly-plot .bg { fill: #1f2430 !important; }
.dark .js-plotly-plot .gtitle, .dark .js-plotly-plot .xtick text, .dark .js-plotly-plot .ytick text,
.dark .js-plotly-plot .annotation-text, .dark .js-plotly-plot .legendtext, .dark .js-plotly-plot .cbtitle text,
.dark .js-plotly-plot g.textpoint text, .dark .js-plotly-plot text.bartext,
.dark .js-plotly-plot .g-xtitle text, .dark .js-plotly-plot .g-ytitle text,
.dark .js-plotly-plot .xaxislayer-above text, .dark .js-plotly-plot .yaxislayer-above text {
  fill: #e6e6e6 !important; }
.dark .js-plotly-plot .gridlayer path, .dark .js-plotly-plot .zerolinelayer path { stroke: #3a4150 !important; }
"""


class BodyLimit:
    """ASGI middleware: a request body larger than `limit` bytes is answered 413 before the app sees
    any of it, whether it announces its length or arrives in chunks. Gradio checks each uploaded
    file alone, and nothing bounded an event's JSON (a 200 MB /queue/join body once cost 614 MiB)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await self._refuse(send)
            return
        parts, size, more = [], 0, True
        while more:  # read it all (at most `limit` bytes), then hand it on in one piece
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            parts.append(msg.get("body", b""))
            size += len(parts[-1])
            if size > self.limit:
                await self._refuse(send)
                return
            more = msg.get("more_body", False)
        body = b"".join(parts)
        given = False

        async def replay():
            nonlocal given
            if given:
                return await receive()
            given = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, send) -> None:
        await send({"type": "http.response.start", "status": 413, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": f"request too large ({self.limit} bytes at most)".encode()})


class ClientWatch:
    """ASGI middleware: when the client of a session's event stream (/queue/data?session_hash=X, open
    while the session has an event queued or running) goes away before the stream ends, call
    on_gone(X) at once. Gradio notices only at its next message, and a running job not at all."""

    def __init__(self, app, on_gone: Callable[[str], None]):
        self.app, self.on_gone = app, on_gone

    async def __call__(self, scope, receive, send):
        sid = None
        if scope["type"] == "http" and scope["path"].endswith("/queue/data"):
            sid = (parse_qs(scope.get("query_string", b"").decode("latin-1")).get("session_hash") or [None])[0]
        if not sid:
            await self.app(scope, receive, send)
            return
        inbox: asyncio.Queue = asyncio.Queue()
        ended = False

        async def watch():
            while True:
                msg = await receive()
                await inbox.put(msg)
                if msg["type"] == "http.disconnect":
                    if not ended:
                        self.on_gone(sid)
                    return

        async def tracked_send(msg):
            nonlocal ended
            if msg["type"] == "http.response.body" and not msg.get("more_body", False):
                ended = True
            await send(msg)

        watcher = asyncio.create_task(watch())
        try:
            await self.app(scope, inbox.get, tracked_send)
        finally:
            watcher.cancel()


def serve(wb: Workbench, host: str = "127.0.0.1", port: int | None = None, block: bool = True) -> tuple[gr.Blocks, str]:
    """Launch with the security defaults: no share link, nothing readable through the file route but
    saved trees, runs and downloads, request bodies bounded, no tracebacks sent to the browser.
    -> (app, local URL); block=False returns at once (tests)."""
    from starlette.middleware import Middleware

    app = build_app(wb)
    app.queue(default_concurrency_limit=1, max_size=64)
    trim_heap_periodically()
    store = wb.store
    _, url, _ = app.launch(server_name=host, server_port=port, share=False, show_error=False, quiet=not block,
                           allowed_paths=[str(store.trees_dir), str(store.runs_dir), str(store.downloads_dir)],
                           max_file_size=MAX_UPLOAD, prevent_thread_lock=not block, css=TEXT_CSS + WARMUP_CSS, head=PLOT_JS + CLONE_JS,
                           state_session_capacity=GRADIO_SESSIONS,
                           app_kwargs={"middleware": [Middleware(BodyLimit, limit=MAX_REQUEST),
                                                      Middleware(ClientWatch, on_gone=wb.sessions.close)]})
    return app, url


def build_app(wb: Workbench) -> gr.Blocks:
    """The page: every tab's layout, then every tab's events (a tab may use another's components),
    the named API, and what a page shows when it opens."""
    page = Page(wb)
    bar = ModelBar(wb)
    tabs = [cls(wb) for cls in tab_classes()]  # every module of workbench/tabs/, in page order
    tab = {type(t): t for t in tabs}
    decode, editor, tune = tab[DecodeTab], tab[EditorTab], tab[TuneTab]  # the model bar's and the API's
    with gr.Blocks(title="medusa-workbench", delete_cache=GRADIO_CACHE) as app:
        gr.Markdown("## medusa-workbench")
        page.layout()
        bar.layout(page)
        for t in tabs:
            with gr.Tab(t.title):
                t.layout(page)
        bar.wire(page, decode.mode)
        for t in tabs:
            t.wire(page)
        Api(decode, editor, tune).wire(page)
        bar_out = [bar.model, bar.chat, bar.info, decode.mode]

        def on_load(text, request: gr.Request):
            session = page.session(request)
            updates = dict(zip(bar_out, bar.on_load(session))) | dict(zip(page.tree_dropdowns, page.dropdown_updates()))
            for t in tabs:
                updates |= t.on_load(session, text)
            return updates

        app.load(on_load, page.editor, bar_out + page.tree_dropdowns + [c for t in tabs for c in t.load_outputs()],
                 api_visibility="private", **page.quiet)
    return app
