"""The Gradio app: Decode, Tree editor, Tune and Compare tabs over one Workbench (one Engine).

Wiring only: every event calls a `Workbench` method (handlers.py) and turns its result into
component updates. State is per browser session, found by Gradio's session hash; nothing heavy lives
in gr.State. Decoding events share one concurrency group of size 1 (one engine). Internal events are
private; the named API is /generate, /validate_tree and /optimize_tree (README, docs/app.md).
"""

from __future__ import annotations

import csv
import json
import tempfile
from pathlib import Path

import gradio as gr

import trees
from engine.accept import RULES

from . import figures
from .handlers import EDITOR, MAX_PROMPT_CHARS, UserError, Workbench, example_prompt, text_html

DECODE_GROUP = "decode"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_UPLOAD = "1mb"  # per file (Gradio's check) ...
MAX_UPLOAD_REQUEST = 2_000_000  # ... and per request, all files together (UploadLimit)
PRIVATE = dict(api_visibility="private")
ACCEPT_CHOICES = [(rule.label, name) for name, rule in RULES.items()]  # (label shown, value sent)
TABLE_HEADERS = ["node", "path", "token", "head p", "path p", "status", "why"]
TEXT_CSS = """
pre.out { white-space: pre-wrap; font-size: 14px; line-height: 1.45; max-height: 460px; overflow-y: auto; margin: 0; }
.s0 { background: #e3f2fd; } .s1 { background: #fff3e0; } .s2 { background: #e8f5e9; }
.s3 { background: #fce4ec; } .s4 { background: #ede7f6; } .s5 { background: #f1f8e9; }
#tree-json .cm-editor, #tree-json .cm-scroller { max-height: 420px !important; min-height: 160px !important; }
#tree-json .cm-scroller { overflow-y: auto !important; }
pre.out span { cursor: pointer; } pre.out span.sel { outline: 2px solid #ff7f0e; background: #ffe0b2; }
"""
TEXT_JS = """
element.addEventListener('click', (e) => {
  const s = e.target.closest('[data-step]');
  if (s) trigger('click', {step: parseInt(s.dataset.step)});
});
"""


class UploadLimit:
    """ASGI middleware: an upload request whose body (all files together) exceeds `limit` bytes is
    answered 413 before it is read; Gradio's own max_file_size checks each file alone."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"].rstrip("/").endswith("/upload"):
            length = dict(scope.get("headers") or []).get(b"content-length")
            if length is None or not length.isdigit() or int(length) > self.limit:
                await send({"type": "http.response.start", "status": 413,
                            "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"upload too large (2 MB per request at most)"})
                return
            seen = 0
            inner = receive

            async def receive():  # the body may not exceed what the header announced
                nonlocal seen
                msg = await inner()
                seen += len(msg.get("body", b""))
                if seen > int(length):
                    raise ValueError("upload body longer than its content-length")
                return msg
        await self.app(scope, receive, send)


def serve(wb: Workbench, host: str = "127.0.0.1", port: int | None = None, block: bool = True) -> tuple[gr.Blocks, str]:
    """Launch with the security defaults: no share link, nothing readable through the file route but
    saved trees and runs, uploads bounded per file and per request, no tracebacks sent to the
    browser. -> (app, local URL); block=False returns at once (tests)."""
    from starlette.middleware import Middleware

    app = build_app(wb)
    app.queue(default_concurrency_limit=1, max_size=64)
    _, url, _ = app.launch(server_name=host, server_port=port, share=False, show_error=False, quiet=not block,
                           allowed_paths=[str(wb.store.trees_dir), str(wb.store.runs_dir)], max_file_size=MAX_UPLOAD,
                           prevent_thread_lock=not block, css=TEXT_CSS,
                           app_kwargs={"middleware": [Middleware(UploadLimit, limit=MAX_UPLOAD_REQUEST)]})
    return app, url


def _sid(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "default"


def _write_temp(name: str, text: str) -> str:
    d = Path(tempfile.mkdtemp(prefix="mwb-"))
    p = d / name
    p.write_text(text, encoding="utf-8")
    return str(p)


def build_app(wb: Workbench) -> gr.Blocks:
    eng = wb.engine
    max_tokens = max(1, min(2048, eng.max_seq_len - 16))
    with gr.Blocks(title="medusa-workbench") as app:
        gr.Markdown(f"## medusa-workbench · `{eng.name}` · {eng.num_heads} Medusa heads · {eng.device} · "
                    f"{eng.model.backend} attention" + (" · CUDA graphs" if eng.graphs else ""))
        names = wb.tree_names()
        with gr.Tab("Decode"):
            with gr.Row():
                with gr.Column(scale=3):
                    prompt = gr.Textbox(label="prompt", value=example_prompt(), lines=5, max_length=MAX_PROMPT_CHARS)
                    with gr.Row():
                        run_btn = gr.Button("Generate", variant="primary")
                        stop_btn = gr.Button("Stop", variant="stop")
                    stats = gr.Markdown("no run yet", elem_id="stats")
                with gr.Column(scale=2):
                    tree_pick = gr.Dropdown(names, value=trees.DEFAULT_TREE, label="tree")
                    with gr.Row():
                        mode = gr.Radio(["medusa", "ar"], value="medusa", label="mode")
                        accept = gr.Radio(ACCEPT_CHOICES, value="greedy", label="acceptance",
                                          info="greedy and sample are lossless; typical is not")
                    with gr.Row():
                        temperature = gr.Slider(0, 2, value=0.7, step=0.05, label="temperature (typical / sample)")
                        top_p = gr.Slider(0.05, 1, value=1.0, step=0.05, label="top-p")
                    with gr.Row():
                        seed = gr.Number(value=0, precision=0, label="seed", minimum=0)
                        max_new = gr.Slider(1, max_tokens, value=96, step=1, label="max new tokens")
            out_html = gr.HTML("", html_template="<pre class='out'>${value}</pre>", js_on_load=TEXT_JS,
                               label="output (colour = decoding step; click a piece to select its step)",
                               elem_id="out-text")
            with gr.Row():
                step = gr.Slider(0, 1, value=0, step=1, label="step", scale=5, elem_id="step-slider")
                play_btn = gr.Button("▶ play", scale=1)
            timer = gr.Timer(0.6, active=False)
            with gr.Row():
                prune = gr.Slider(0, 0.5, value=0.02, step=0.005, label="prune: hide nodes whose path probability is below",
                                  info="the accepted path and its siblings always stay", scale=3)
                show_all = gr.Checkbox(False, label="show every node", scale=1)
                collapse = gr.Dropdown([], value=[], multiselect=True, label="collapse subtrees (node paths)", scale=3)
            gr.Markdown("**Step tree**: drag to pan, box or scroll to zoom, hover any node; orange rings show the "
                        "target's own token where the drafted children missed it.")
            tree_plot = gr.Plot(show_label=False, elem_id="tree-plot")
            with gr.Row():
                head_plot = gr.Plot(show_label=False, elem_id="head-plot")
                with gr.Column():
                    node_table = gr.Dataframe(headers=TABLE_HEADERS, label="this step's nodes", interactive=False,
                                              max_height=520)
                    with gr.Row():
                        table_csv = gr.DownloadButton("table CSV", size="sm")
                        table_json = gr.DownloadButton("table JSON", size="sm")
            with gr.Row():
                run_plot = gr.Plot(show_label=False, elem_id="run-plot")
                heat_plot = gr.Plot(show_label=False, elem_id="heat-plot")
            with gr.Accordion("calibration, downloads and saved runs", open=False):
                calib_plot = gr.Plot(show_label=False)
                with gr.Row():
                    fig_btn = gr.Button("figures as HTML")
                    fig_files = gr.File(label="figure files", file_count="multiple")
                with gr.Row():
                    runs_pick = gr.Dropdown(wb.run_choices(), label="saved runs (newest first)", scale=4)
                    load_run_btn = gr.Button("Load run", scale=1)
                    run_files = gr.File(label="run files (trace JSONL + settings)", file_count="multiple", scale=3)
                runs_msg = gr.Markdown()
        with gr.Tab("Tree editor"):
            with gr.Row():
                with gr.Column(scale=2):
                    editor = gr.Code(value=json.dumps(trees.preset(trees.DEFAULT_TREE)), language="json",
                                     label="medusa_choices", lines=8, max_lines=16, wrap_lines=True, elem_id="tree-json")
                    valid_msg = gr.Markdown(elem_id="valid-msg")
                    with gr.Row():
                        load_pick = gr.Dropdown(names[1:], value=trees.DEFAULT_TREE, label="load a tree")
                        load_btn = gr.Button("Load into editor")
                    with gr.Row():
                        edit_path = gr.Textbox(label="node path, e.g. [0, 1] ([] = root)", value="[0]")
                        edit_rank = gr.Number(label="rank", value=0, precision=0, minimum=0, maximum=1023)
                        edit_op = gr.Radio(["add child", "add sibling", "delete subtree"], value="add child", label="edit")
                    edit_btn = gr.Button("Apply edit")
                    with gr.Row():
                        save_name = gr.Textbox(label="save as", value="my_tree")
                        overwrite = gr.Checkbox(label="overwrite", value=False)
                        save_btn = gr.Button("Save")
                    save_msg = gr.Markdown()
                    download = gr.File(label="download JSON", height=70)
                    with gr.Row():
                        export_fmt = gr.Radio(["trtllm", "vllm", "json"], value="vllm", label="export for")
                        export_btn = gr.Button("Export")
                    export_out = gr.Textbox(label="export", lines=2)
                    with gr.Row():
                        diff_a = gr.Dropdown(names, value="mc_sim_7b_63", label="diff: from")
                        diff_b = gr.Dropdown(names, value=EDITOR, label="to")
                        diff_btn = gr.Button("Diff")
                    diff_out = gr.Markdown()
                with gr.Column(scale=3):
                    editor_plot = gr.Plot(show_label=False,
                                          elem_id="editor-plot")
        with gr.Tab("Tune"):
            with gr.Row():
                src = gr.Radio(["held-out", "pasted", "file"], value="held-out", label="prompt set")
                n_prompts = gr.Slider(1, 64, value=8, step=1, label="prompts")
                tune_tokens = gr.Slider(16, max_tokens, value=128, step=16, label="tokens per prompt")
            with gr.Row():
                pasted = gr.Textbox(label="pasted prompts (JSONL with 'prompt'/'turns', or blocks separated by '---')",
                                    lines=3)
                upload = gr.File(label="prompt file (.jsonl or text)", file_types=[".jsonl", ".json", ".txt", ".md"])
            with gr.Row():
                collect_btn = gr.Button("Collect AR traces", variant="primary")
                tune_stop = gr.Button("Stop", variant="stop")
            collect_msg = gr.Markdown()
            with gr.Row():
                pool_pick = gr.Dropdown(wb.store.pool_names(), label="saved trace pools")
                pool_btn = gr.Button("Use pool")
            acc_plot = gr.Plot(show_label=False)
            with gr.Row():
                sizes = gr.Textbox("4,8,12,16,24,32,48,64", label="sizes to time (nodes)")
                lat_btn = gr.Button("Measure step times here")
                lat_file = gr.File(label="or load `bench --part latency` JSON", file_types=[".json"])
            lat_msg = gr.Markdown()
            with gr.Row():
                opt_nodes = gr.Slider(1, trees.MAX_NODES, value=16, step=1, label="tree nodes (the most, with latency)")
                opt_method = gr.Radio(["replay", "position", "independent"], value="replay", label="objective")
                opt_latency = gr.Checkbox(False, label="choose the size by E(n)/t(n)")
                opt_btn = gr.Button("Optimise → editor", variant="primary")
            opt_msg = gr.Markdown()
            size_plot = gr.Plot(show_label=False, visible=False)
            confirm_btn = gr.Button("Confirm the editor's tree (real run on these prompts)")
            confirm_msg = gr.Markdown()
        with gr.Tab("Compare"):
            with gr.Row():
                cmp_a = gr.Dropdown(["ar"] + names, value="ar", label="A")
                cmp_b = gr.Dropdown(["ar"] + names, value=trees.DEFAULT_TREE, label="B")
                cmp_src = gr.Radio(["held-out", "pasted", "file"], value="held-out", label="prompt set")
                cmp_n = gr.Slider(1, 64, value=4, step=1, label="prompts")
            with gr.Row():
                cmp_pasted = gr.Textbox(label="pasted prompts", lines=2)
                cmp_upload = gr.File(label="prompt file", file_types=[".jsonl", ".json", ".txt", ".md"])
            with gr.Row():
                cmp_tokens = gr.Slider(8, max_tokens, value=64, step=8, label="tokens per prompt")
                cmp_accept = gr.Radio(ACCEPT_CHOICES, value="greedy", label="acceptance")
                cmp_temp = gr.Slider(0, 2, value=0.7, step=0.05, label="temperature")
                cmp_seed = gr.Number(value=0, precision=0, label="seed", minimum=0)
            with gr.Row():
                cmp_btn = gr.Button("Compare", variant="primary")
                cmp_stop = gr.Button("Stop", variant="stop")
            cmp_table = gr.Dataframe(headers=["prompt", "A tokens/step", "B tokens/step", "A tokens/s", "B tokens/s",
                                              "same output"], interactive=False)
            cmp_msg = gr.Markdown(elem_id="cmp-msg")
            gr.Markdown("**Acceptance rules** on the same prompts and tree: greedy and sample are lossless, typical is "
                        "not. Distance = total variation from the model's own sampling (first 2 tokens).")
            with gr.Row():
                rules_tree = gr.Dropdown(names, value=trees.DEFAULT_TREE, label="tree")
                rules_temp = gr.Slider(0.05, 2, value=0.7, step=0.05, label="temperature")
                rules_samples = gr.Slider(4, 128, value=32, step=4, label="samples per prompt and rule")
                rules_btn = gr.Button("Compare acceptance rules")
            rules_table = gr.Dataframe(headers=["rule", "lossless", "tokens/step", "TV to AR sampling"], interactive=False)
            rules_msg = gr.Markdown()

        tree_dropdowns = [tree_pick, load_pick, diff_a, diff_b, cmp_a, cmp_b, rules_tree]

        def dropdown_updates():
            names = wb.tree_names()
            return [gr.update(choices=names), gr.update(choices=names[1:]), gr.update(choices=names),
                    gr.update(choices=names), gr.update(choices=["ar"] + names), gr.update(choices=["ar"] + names),
                    gr.update(choices=names)]

        def view_of(prune_v, show, collapsed) -> figures.TreeView:
            try:
                paths = frozenset(tuple(json.loads(c)) for c in (collapsed or []))
            except (ValueError, TypeError):
                paths = frozenset()
            return figures.TreeView(float(prune_v or 0), bool(show), paths)

        def collapse_choices(session) -> list[str]:
            run = session.run
            if run is None or not run.traces:
                return []
            return [json.dumps(p) for p in run.traces[0]["tree"] if len(p) < max(len(q) for q in run.traces[0]["tree"])]

        # -- Decode -------------------------------------------------------------------------------------
        def begin(request: gr.Request):
            wb.sessions.get(_sid(request)).stop.clear()
            return "⏳ decoding…"

        def decode_stream(prompt, tree_choice, editor_text, mode, accept, temperature, top_p, seed, max_new, prune_v, show,
                          collapsed, request: gr.Request):
            session = wb.sessions.get(_sid(request))
            view = view_of(prune_v, show, collapsed)
            skip = gr.update()
            for ev in wb.decode(session, prompt, tree_choice, editor_text, mode, accept, temperature, top_p, seed, max_new):
                if "error" in ev:
                    yield (f"✗ {ev['error']}",) + (skip,) * 11
                    return
                tr = ev["trace"]
                last = max(0, ev["steps"] - 1)
                tree_fig = figures.step_tree_figure(tr, view) if tr is not None and tr.get("tree") else skip
                head_fig = skip
                if tr is not None and session.run is not None:
                    head_fig = figures.head_panel(tr, figures.next_tokens(session.run.traces, last),
                                                  [tuple(h) for h in session.run.head_hits])
                if not ev["done"]:
                    yield (ev["stats"], ev["html"], gr.update(maximum=max(1, last), value=last), tree_fig, head_fig) + \
                        (skip,) * 7
                    continue
                _, _, table = wb.step_view(session, last, view)
                run_fig, heat_fig, calib_fig = wb.run_figures(session, last)
                yield (ev["stats"], ev["html"], gr.update(maximum=max(1, last), value=last), tree_fig, head_fig, table,
                       run_fig, heat_fig if heat_fig is not None else skip, calib_fig,
                       gr.update(choices=wb.run_choices()), gr.update(choices=collapse_choices(session), value=[]),
                       f"saved as run {session.run.run_id}" if session.run and session.run.run_id else "")

        decode_out = [stats, out_html, step, tree_plot, head_plot, node_table, run_plot, heat_plot, calib_plot, runs_pick,
                      collapse, runs_msg]
        run_btn.click(begin, None, stats, queue=False, **PRIVATE).then(
            decode_stream, [prompt, tree_pick, editor, mode, accept, temperature, top_p, seed, max_new, prune, show_all,
                            collapse],
            decode_out, concurrency_limit=1, concurrency_id=DECODE_GROUP, **PRIVATE)
        def stop(request: gr.Request):
            wb.stop(wb.sessions.get(_sid(request)))

        stop_btn.click(stop, None, None, queue=False, **PRIVATE)

        def select(s, prune_v, show, collapsed, request: gr.Request):
            session = wb.sessions.get(_sid(request))
            tree_fig, head_fig, table = wb.step_view(session, s, view_of(prune_v, show, collapsed))
            if session.run is None:
                return (gr.update(),) * 6
            run_fig, _, _ = wb.run_figures(session, int(s))
            return tree_fig, head_fig, table, run_fig, text_html(session.run.pieces, int(s)), gr.update(value=int(s))

        select_out = [tree_plot, head_plot, node_table, run_plot, out_html, step]
        view_in = [prune, show_all, collapse]
        step.release(select, [step] + view_in, select_out, **PRIVATE)

        def clicked_text(prune_v, show, collapsed, evt: gr.EventData, request: gr.Request):
            data = getattr(evt, "_data", None) or {}
            return select(data.get("step", 0), prune_v, show, collapsed, request)

        out_html.click(clicked_text, view_in, select_out, **PRIVATE)

        def redraw(s, prune_v, show, collapsed, request: gr.Request):
            tree_fig, _, _ = wb.step_view(wb.sessions.get(_sid(request)), s, view_of(prune_v, show, collapsed))
            return tree_fig if tree_fig is not None else gr.update()

        for c in (prune, show_all, collapse):
            c.change(redraw, [step] + view_in, tree_plot, **PRIVATE)

        def toggle_play(label):
            playing = label.startswith("▶")
            return gr.update(value="⏸ pause" if playing else "▶ play"), gr.Timer(active=playing)

        play_btn.click(toggle_play, play_btn, [play_btn, timer], queue=False, **PRIVATE)

        def tick(s, prune_v, show, collapsed, request: gr.Request):
            session = wb.sessions.get(_sid(request))
            n = len(session.run.traces) if session.run else 0
            if not n:
                return (gr.update(),) * 6 + (gr.update(value="▶ play"), gr.Timer(active=False))
            nxt = (int(s) + 1) % n
            return select(nxt, prune_v, show, collapsed, request) + (gr.update(), gr.Timer(active=True))

        timer.tick(tick, [step] + view_in, select_out + [play_btn, timer], **PRIVATE)

        def table_file(table, kind):
            rows = table.values.tolist() if hasattr(table, "values") else (table or [])
            if kind == "csv":
                import io

                buf = io.StringIO()
                w = csv.writer(buf)
                w.writerow(TABLE_HEADERS)
                w.writerows(rows)
                return _write_temp("nodes.csv", buf.getvalue())
            return _write_temp("nodes.json", json.dumps([dict(zip(TABLE_HEADERS, r)) for r in rows], default=str))

        table_csv.click(lambda t: table_file(t, "csv"), node_table, table_csv, **PRIVATE)
        table_json.click(lambda t: table_file(t, "json"), node_table, table_json, **PRIVATE)

        def figure_files(*figs):
            out = []
            for name, fig in zip(("step_tree", "heads", "run", "acceptance", "calibration"), figs):
                if isinstance(fig, dict) and "plot" in fig:  # a gr.Plot value
                    import plotly.io as pio

                    fig = pio.from_json(fig["plot"])
                if fig is not None and hasattr(fig, "write_html"):
                    p = Path(tempfile.mkdtemp(prefix="mwb-")) / f"{name}.html"
                    fig.write_html(p, include_plotlyjs=True)
                    out.append(str(p))
            return out or None

        fig_btn.click(figure_files, [tree_plot, head_plot, run_plot, heat_plot, calib_plot], fig_files, **PRIVATE)

        def load_run(run_id, prune_v, show, collapsed, request: gr.Request):
            session = wb.sessions.get(_sid(request))
            msg = wb.load_run(session, run_id)
            if msg.startswith("✗") or session.run is None:
                return (msg,) + (gr.update(),) * 11
            last = len(session.run.traces) - 1
            tree_fig, head_fig, table = wb.step_view(session, last, view_of(prune_v, show, collapsed))
            run_fig, heat_fig, calib_fig = wb.run_figures(session, last)
            d = wb.store.run_dir(session.run.run_id)
            return (msg, text_html(session.run.pieces), gr.update(maximum=max(1, last), value=last), tree_fig, head_fig,
                    table, run_fig, heat_fig, calib_fig, [str(d / "trace.jsonl"), str(d / "settings.json")],
                    session.run.stats(), gr.update(choices=collapse_choices(session), value=[]))

        load_run_btn.click(load_run, [runs_pick] + view_in,
                           [runs_msg, out_html, step, tree_plot, head_plot, node_table, run_plot, heat_plot, calib_plot,
                            run_files, stats, collapse], **PRIVATE)

        # -- Tree editor ------------------------------------------------------------------------------------
        def validate_ui(text, request: gr.Request):
            msg, fig, _ = wb.validate_tree(text, wb.sessions.get(_sid(request)))
            return msg, fig if fig is not None else gr.update()

        editor.change(validate_ui, editor, [valid_msg, editor_plot], **PRIVATE)

        def load_into_editor(choice):
            try:
                return json.dumps(wb.resolve_choice(choice, "[]"))
            except UserError as e:
                gr.Warning(str(e))
                return gr.update()

        load_btn.click(load_into_editor, load_pick, editor, **PRIVATE)
        edit_btn.click(lambda t, o, p, r: wb.edit_tree(t, o, p, r), [editor, edit_op, edit_path, edit_rank],
                       [editor, valid_msg], **PRIVATE)

        def save(name, text, ow, request: gr.Request):
            msg, path = wb.save_tree(name, text, ow, wb.sessions.get(_sid(request)))
            return [msg, path] + dropdown_updates()

        save_btn.click(save, [save_name, editor, overwrite], [save_msg, download] + tree_dropdowns, **PRIVATE)
        export_btn.click(lambda t, f: wb.export_tree(t, f), [editor, export_fmt], export_out, **PRIVATE)
        def diff(a, b, t, request: gr.Request):
            return wb.diff_trees(a, b, t, wb.sessions.get(_sid(request)))

        diff_btn.click(diff, [diff_a, diff_b, editor], diff_out, **PRIVATE)

        # -- Tune ---------------------------------------------------------------------------------------------
        def collect(source, text, file, n, tokens, request: gr.Request, progress=gr.Progress()):
            session = wb.sessions.get(_sid(request))
            try:
                prompts = wb.prompt_set(source, text, file, n)
            except UserError as e:
                return f"✗ {e}", gr.update(), gr.update()
            msg = wb.collect(session, prompts, tokens, progress)
            vec = [v for r in session.pool for v in r.vectors]
            fig = figures.head_accuracy_figure(trees.head_stats(vec, eng.num_heads)) if vec else gr.update()
            return msg, fig, gr.update(choices=wb.store.pool_names(), value=session.pool_name)

        collect_btn.click(collect, [src, pasted, upload, n_prompts, tune_tokens], [collect_msg, acc_plot, pool_pick],
                          concurrency_limit=1, concurrency_id=DECODE_GROUP, **PRIVATE)
        for b in (tune_stop, cmp_stop):
            b.click(stop, None, None, queue=False, **PRIVATE)

        def use_pool(name, request: gr.Request):
            return wb.use_pool(wb.sessions.get(_sid(request)), name)

        pool_btn.click(use_pool, pool_pick, collect_msg, **PRIVATE)

        def measure(sz, source, text, file, n, tokens, request: gr.Request, progress=gr.Progress()):
            try:
                prompts = wb.prompt_set(source, text, file, min(int(n), 4))
            except (UserError, ValueError) as e:
                return f"✗ {e}"
            return wb.measure_latency(wb.sessions.get(_sid(request)), sz, prompts, min(int(tokens), 64), progress)

        lat_btn.click(measure, [sizes, src, pasted, upload, n_prompts, tune_tokens], lat_msg, concurrency_limit=1,
                      concurrency_id=DECODE_GROUP, **PRIVATE)
        def load_latency(f, request: gr.Request):
            return wb.load_latency(wb.sessions.get(_sid(request)), f)

        lat_file.upload(load_latency, lat_file, lat_msg, **PRIVATE)

        def optimise_ui(n, method, by_latency, request: gr.Request):
            tree_json, msg, curve = wb.optimize_tree(wb.sessions.get(_sid(request)), n, method, by_latency)
            return (tree_json or gr.update()), msg, gr.update(value=curve, visible=True) if curve is not None else gr.update()

        opt_btn.click(optimise_ui, [opt_nodes, opt_method, opt_latency], [editor, opt_msg, size_plot], **PRIVATE)

        def confirm(text, source, ptext, file, n, tokens, request: gr.Request):
            try:
                prompts = wb.prompt_set(source, ptext, file, n)
            except UserError as e:
                return f"✗ {e}"
            return wb.confirm_tree(wb.sessions.get(_sid(request)), text, prompts, tokens)

        confirm_btn.click(confirm, [editor, src, pasted, upload, n_prompts, tune_tokens], confirm_msg,
                          concurrency_limit=1, concurrency_id=DECODE_GROUP, **PRIVATE)

        # -- Compare ------------------------------------------------------------------------------------------
        def compare(a, b, text, source, ptext, file, n, tokens, acc, temp, sd, request: gr.Request, progress=gr.Progress()):
            try:
                prompts = wb.prompt_set(source, ptext, file, n)
            except UserError as e:
                return [], f"✗ {e}"
            return wb.compare(wb.sessions.get(_sid(request)), a, b, text, prompts, tokens, acc, temp, sd, progress)

        cmp_btn.click(compare, [cmp_a, cmp_b, editor, cmp_src, cmp_pasted, cmp_upload, cmp_n, cmp_tokens, cmp_accept,
                                cmp_temp, cmp_seed], [cmp_table, cmp_msg], concurrency_limit=1,
                      concurrency_id=DECODE_GROUP, **PRIVATE)

        def rules(tree, text, source, ptext, file, n, temp, samples, request: gr.Request):
            try:
                prompts = wb.prompt_set(source, ptext, file, n)
            except UserError as e:
                return [], f"✗ {e}"
            return wb.compare_rules(wb.sessions.get(_sid(request)), tree, text, prompts, temp, samples)

        rules_btn.click(rules, [rules_tree, editor, cmp_src, cmp_pasted, cmp_upload, cmp_n, rules_temp, rules_samples],
                        [rules_table, rules_msg], concurrency_limit=1, concurrency_id=DECODE_GROUP, **PRIVATE)

        # -- named API ----------------------------------------------------------------------------------------
        def api_generate(prompt: str, tree: str = trees.DEFAULT_TREE, mode: str = "medusa", accept: str = "greedy",
                         temperature: float = 0.7, top_p: float = 1.0, seed: float | None = None,
                         max_new_tokens: float = 64, request: gr.Request = None) -> dict:
            """Decode one prompt and return {text, token_ids, steps, mean_accepted, finish_reason, stats, run_id}
            or {error}. Every argument but the prompt has a default; tree is a preset, saved/NAME or tree JSON."""
            return wb.api_generate(wb.sessions.get(_sid(request)), prompt, tree, mode, accept, temperature, top_p,
                                   seed, max_new_tokens)

        def api_validate(text: str, request: gr.Request = None) -> dict:
            """Check a tree: {valid, message, tree (the paths in Medusa order, or null)}."""
            msg, _, normal = wb.validate_tree(text, wb.sessions.get(_sid(request)))
            return {"valid": normal is not None, "message": msg, "tree": json.loads(normal) if normal else None}

        def api_optimize(nodes: float = 16, method: str = "replay", request: gr.Request = None) -> dict:
            """The best tree of `nodes` nodes for this session's AR trace pool: {tree, message} or {error}."""
            tree_json, msg, _ = wb.optimize_tree(wb.sessions.get(_sid(request)), nodes, method)
            return {"tree": json.loads(tree_json), "message": msg} if tree_json else {"error": msg}

        with gr.Row(visible=False):
            a_prompt = gr.Textbox(label="prompt")
            a_tree = gr.Textbox(trees.DEFAULT_TREE, label="tree")
            a_mode = gr.Textbox("medusa", label="mode")
            a_accept = gr.Textbox("greedy", label="accept")
            a_temp = gr.Number(0.7, label="temperature")
            a_top_p = gr.Number(1.0, label="top_p")
            a_seed = gr.Number(None, label="seed")
            a_max = gr.Number(64, label="max_new_tokens")
            a_text = gr.Textbox(label="text")
            a_nodes = gr.Number(16, label="nodes")
            a_method = gr.Textbox("replay", label="method")
            a_out = gr.JSON()
            a_btn = gr.Button()
        a_btn.click(api_generate, [a_prompt, a_tree, a_mode, a_accept, a_temp, a_top_p, a_seed, a_max], a_out,
                    api_name="generate", concurrency_limit=1, concurrency_id=DECODE_GROUP)
        a_text.submit(api_validate, a_text, a_out, api_name="validate_tree")
        a_nodes.submit(api_optimize, [a_nodes, a_method], a_out, api_name="optimize_tree")

        def on_load(text, request: gr.Request):
            msg, fig = validate_ui(text, request)
            return [msg, fig, gr.update(choices=wb.run_choices()), gr.update(choices=wb.store.pool_names())] + \
                dropdown_updates()

        app.load(on_load, editor, [valid_msg, editor_plot, runs_pick, pool_pick] + tree_dropdowns, **PRIVATE)
    return app
