"""The Gradio app: Decode, Tree editor, Tune and Compare tabs over one Workbench (one Engine).

The engine lives in the Workbench object the app owns, never in gr.State; gr.State holds only the
current run's step traces (plain dicts). Decode events share one concurrency group of size 1.
"""

from __future__ import annotations

import json

import gradio as gr

import trees

from . import figures
from .handlers import EDITOR, Workbench, example_prompt, step_view

DECODE_GROUP = "decode"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_UPLOAD = "1mb"


def serve(wb: Workbench, host: str = "127.0.0.1", port: int | None = None, block: bool = True) -> tuple[gr.Blocks, str]:
    """Launch with the security defaults: no share link, only the tree folder is readable through
    the file route, uploads bounded, no error tracebacks sent to the browser. -> (app, local URL);
    block=False returns at once (tests)."""
    app = build_app(wb)
    app.queue(default_concurrency_limit=1, max_size=64)
    _, url, _ = app.launch(server_name=host, server_port=port, share=False, show_error=False, quiet=not block,
                           allowed_paths=[str(wb.tree_dir)], max_file_size=MAX_UPLOAD, prevent_thread_lock=not block)
    return app, url


def build_app(wb: Workbench) -> gr.Blocks:
    num_heads = wb.engine.num_heads
    with gr.Blocks(title="medusa-workbench") as app:
        gr.Markdown(f"## medusa-workbench · `{wb.engine.name}` · {num_heads} Medusa heads · {wb.engine.device}")
        traces_state = gr.State([])
        with gr.Tab("Decode"):
            with gr.Row():
                with gr.Column(scale=2):
                    prompt = gr.Textbox(label="prompt", value=example_prompt(), lines=6, max_length=20000)
                with gr.Column(scale=1):
                    tree_pick = gr.Dropdown(wb.tree_names(), value=trees.DEFAULT_TREE, label="tree", allow_custom_value=False)
                    mode = gr.Radio(["medusa", "ar"], value="medusa", label="mode")
                    accept = gr.Radio(["greedy", "typical", "sample"], value="greedy", label="acceptance",
                                      info="greedy and sample are lossless; typical is not")
                    temperature = gr.Slider(0, 2, value=0.7, step=0.05, label="temperature (typical / sample)")
                    max_new = gr.Slider(1, 512, value=96, step=1, label="max new tokens")
                    with gr.Row():
                        run_btn = gr.Button("Generate", variant="primary")
                        stop_btn = gr.Button("Stop")
            stats = gr.Markdown()
            out_html = gr.HTML(label="output (background colour = decoding step)")
            step = gr.Slider(0, 1, value=0, step=1, label="step (scrub to replay)")
            with gr.Row():
                tree_plot = gr.Plot(label="step tree")
                head_plot = gr.Plot(label="head probabilities")
            node_table = gr.Dataframe(headers=["node", "path", "token", "head p", "path p", "status", "why"],
                                      label="this step's nodes", interactive=False)
            with gr.Row():
                run_plot = gr.Plot(label="run")
                calib_plot = gr.Plot(label="calibration")
        with gr.Tab("Tree editor"):
            with gr.Row():
                with gr.Column():
                    editor = gr.Code(value=json.dumps(trees.preset(trees.DEFAULT_TREE)), language="json", label="medusa_choices")
                    load_pick = gr.Dropdown(wb.tree_names()[1:], value=trees.DEFAULT_TREE, label="load a tree")
                    load_btn = gr.Button("Load into editor")
                    valid_msg = gr.Markdown()
                    with gr.Row():
                        edit_path = gr.Textbox(label="node path, e.g. [0, 1] ([] = root)", value="[0]")
                        edit_rank = gr.Number(label="rank", value=0, precision=0, minimum=0, maximum=99)
                        edit_op = gr.Radio(["add child", "add sibling", "delete subtree"], value="add child", label="edit")
                    edit_btn = gr.Button("Apply edit")
                    with gr.Row():
                        save_name = gr.Textbox(label="save as", value="my_tree")
                        overwrite = gr.Checkbox(label="overwrite", value=False)
                        save_btn = gr.Button("Save")
                    save_msg = gr.Markdown()
                    download = gr.File(label="download JSON")
                    with gr.Row():
                        export_fmt = gr.Radio(["trtllm", "vllm"], value="vllm", label="export for")
                        export_btn = gr.Button("Export")
                    export_out = gr.Textbox(label="export", lines=2)
                    with gr.Row():
                        diff_a = gr.Dropdown(wb.tree_names(), value="mc_sim_7b_63", label="diff: from")
                        diff_b = gr.Dropdown(wb.tree_names(), value=EDITOR, label="to")
                        diff_btn = gr.Button("Diff")
                    diff_out = gr.Markdown()
                with gr.Column():
                    editor_plot = gr.Plot(label="tree (colour: predicted path probability)")
        with gr.Tab("Tune"):
            with gr.Row():
                n_prompts = gr.Slider(1, 24, value=6, step=1, label="held-out prompts")
                tune_tokens = gr.Slider(16, 256, value=96, step=16, label="tokens per prompt")
                collect_btn = gr.Button("Collect traces")
            collect_msg = gr.Markdown()
            with gr.Row():
                opt_nodes = gr.Slider(1, 128, value=16, step=1, label="tree nodes")
                opt_est = gr.Radio(["empirical", "independent"], value="empirical", label="estimator")
                opt_btn = gr.Button("Optimise → editor", variant="primary")
            opt_msg = gr.Markdown()
            confirm_btn = gr.Button("Confirm the editor's tree (real run on the same prompts)")
            confirm_msg = gr.Markdown()
            acc_plot = gr.Plot(label="head accuracy")
        with gr.Tab("Compare"):
            with gr.Row():
                cmp_a = gr.Dropdown(["ar"] + wb.tree_names(), value="ar", label="A")
                cmp_b = gr.Dropdown(["ar"] + wb.tree_names(), value=trees.DEFAULT_TREE, label="B")
                cmp_n = gr.Slider(1, 12, value=3, step=1, label="held-out prompts")
                cmp_btn = gr.Button("Compare")
            cmp_table = gr.Dataframe(headers=["prompt", "A tokens/step", "B tokens/step", "A tokens/s", "B tokens/s", "same output"],
                                     interactive=False)
            cmp_msg = gr.Markdown()
            gr.Markdown("**Acceptance rules** on the same prompts and tree: greedy and sample are lossless, "
                        "typical is not. Distance = total variation from the model's own sampling (first 2 tokens).")
            with gr.Row():
                rules_tree = gr.Dropdown(wb.tree_names(), value=trees.DEFAULT_TREE, label="tree")
                rules_temp = gr.Slider(0.05, 2, value=0.7, step=0.05, label="temperature")
                rules_samples = gr.Slider(4, 128, value=32, step=4, label="samples per prompt and rule")
                rules_btn = gr.Button("Compare acceptance rules")
            rules_table = gr.Dataframe(headers=["rule", "lossless", "tokens/step", "TV to AR sampling"], interactive=False)
            rules_msg = gr.Markdown()

        # -- events ----------------------------------------------------------------------------
        def generate(prompt, tree_choice, editor_text, mode, accept, temperature, max_new):
            last = None
            for ev in wb.stream(prompt, tree_choice, editor_text, mode, accept, temperature, max_new):
                if "error" in ev:
                    gr.Warning(ev["error"])
                    yield (f"✗ {ev['error']}", gr.update(), gr.update(), gr.update(), gr.update(), gr.update(),
                           gr.update(), gr.update(), gr.update())
                    return
                last = ev
                tree_fig, head_fig, table = step_view(ev["traces"], len(ev["traces"]) - 1)
                yield (ev["stats"], ev["html"], ev["traces"], gr.update(maximum=max(1, len(ev["traces"]) - 1),
                       value=len(ev["traces"]) - 1), tree_fig, head_fig, table, gr.update(), gr.update())
            if last is not None:
                yield (gr.update(),) * 7 + (figures.run_figure(last["traces"]), figures.calibration_figure(last["traces"]))

        run_btn.click(generate, [prompt, tree_pick, editor, mode, accept, temperature, max_new],
                      [stats, out_html, traces_state, step, tree_plot, head_plot, node_table, run_plot, calib_plot],
                      concurrency_limit=1, concurrency_id=DECODE_GROUP, api_name="generate_stream")
        stop_btn.click(lambda: wb.stop_event.set(), None, None, queue=False)
        step.input(lambda tr, s: step_view(tr, s), [traces_state, step], [tree_plot, head_plot, node_table])

        def api_generate(prompt: str, tree: str = trees.DEFAULT_TREE, mode: str = "medusa", accept: str = "greedy",
                         max_new_tokens: int = 64) -> dict:
            """Whole generation as JSON (for gradio_client)."""
            # `tree` is a preset / saved name, or tree JSON (then it goes through the editor's parser)
            choice, text = (EDITOR, tree) if tree.strip().startswith(("[", "{")) else (tree, "")
            last = None
            for ev in wb.stream(prompt, choice, text, mode, accept, 0.7, max_new_tokens):
                if "error" in ev:
                    return {"error": ev["error"]}
                last = ev
            tokens = [t for s in last["traces"] for t in s["accepted_tokens"]]
            return {"text": wb.engine.text_of(tokens), "token_ids": tokens, "steps": len(last["traces"]),
                    "mean_accepted": len(tokens) / len(last["traces"]), "stats": last["stats"]}

        api_in = [gr.Textbox(visible=False), gr.Textbox(visible=False), gr.Textbox(visible=False),
                  gr.Textbox(visible=False), gr.Number(visible=False)]
        api_out = gr.JSON(visible=False)
        api_btn = gr.Button(visible=False)
        api_btn.click(api_generate, api_in, api_out, api_name="generate", concurrency_limit=1, concurrency_id=DECODE_GROUP)

        def validate(text):
            msg, fig, _ = wb.validate_tree(text)
            return msg, fig if fig is not None else gr.update()

        editor.change(validate, editor, [valid_msg, editor_plot], api_name="validate_tree")
        load_btn.click(lambda c: json.dumps(wb.resolve_choice(c, "[]")), load_pick, editor)
        edit_btn.click(lambda t, o, p, r: wb.edit_tree(t, o, p, r), [editor, edit_op, edit_path, edit_rank], [editor, valid_msg])

        def save(name, text, ow):
            msg, path = wb.save_tree(name, text, ow)
            names = wb.tree_names()
            return msg, path, gr.update(choices=names), gr.update(choices=names[1:])

        save_btn.click(save, [save_name, editor, overwrite], [save_msg, download, tree_pick, load_pick])
        export_btn.click(lambda t, f: wb.export_tree(t, f), [editor, export_fmt], export_out)
        diff_btn.click(lambda a, b, t: wb.diff_trees(a, b, t), [diff_a, diff_b, editor], diff_out)

        def collect(n, tokens):
            msg = wb.collect(n, tokens)
            vec = list(wb.rank_log)
            return msg, figures.head_accuracy_figure(trees.head_stats(vec, wb.engine.num_heads))

        collect_btn.click(collect, [n_prompts, tune_tokens], [collect_msg, acc_plot], concurrency_limit=1,
                          concurrency_id=DECODE_GROUP)

        def optimise(n, est):
            tree_json, msg = wb.optimize_tree(n, est)
            return (tree_json or gr.update()), msg

        opt_btn.click(optimise, [opt_nodes, opt_est], [editor, opt_msg], api_name="optimize_tree")
        confirm_btn.click(lambda t, n, k: wb.confirm_tree(t, n, k), [editor, n_prompts, tune_tokens], confirm_msg,
                          concurrency_limit=1, concurrency_id=DECODE_GROUP)

        cmp_btn.click(wb.compare, [cmp_a, cmp_b, cmp_n, editor], [cmp_table, cmp_msg], concurrency_limit=1,
                      concurrency_id=DECODE_GROUP)
        rules_btn.click(wb.compare_rules, [rules_tree, editor, cmp_n, rules_temp, rules_samples], [rules_table, rules_msg],
                        concurrency_limit=1, concurrency_id=DECODE_GROUP)
        app.load(validate, editor, [valid_msg, editor_plot])
    return app
