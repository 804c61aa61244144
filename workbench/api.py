"""The named API (`gradio_client`): /generate, /validate_tree and /optimize_tree, every argument but
the prompt defaulted; each returns a JSON-serialisable dict, `{"error": ...}` for bad input.

An API client is a session of its own, so the page's model selector never reaches it: /generate takes
the model by name instead (`model`, one of the selector's choices; the client then stays on it, as a
page does after choosing, and an empty name keeps the client's model: the start-up one at first)."""

from __future__ import annotations

import json

import gradio as gr

import trees

from .core import EDITOR
from .page import ENGINE_QUEUE, Page
from .session import Session, UserError
from .tabs.decode import DecodeTab
from .tabs.editor import EditorTab
from .tabs.tune import TuneTab


class Api:
    def __init__(self, decode: DecodeTab, editor: EditorTab, tune: TuneTab):
        self.decode, self.editor, self.tune = decode, editor, tune

    def generate(self, session: Session, prompt: object, tree: object = trees.DEFAULT_TREE, mode: object = "medusa",
                 accept: object = "greedy", temperature: object = 0.7, top_p: object = 1.0, seed: object = None,
                 max_new_tokens: object = 64, model: object = None) -> dict:
        """Whole generation as JSON; tree is a preset, saved/NAME or tree JSON; model a name the app offers."""
        if isinstance(model, str) and model.strip():
            try:
                self.decode.wb.choose_model(session, model)
            except UserError as e:
                return {"error": str(e)}
        tree = tree if isinstance(tree, str) and tree.strip() else trees.DEFAULT_TREE
        choice, text = (EDITOR, tree) if tree.strip().startswith(("[", "{")) else (tree, "")
        last = None
        for ev in self.decode.decode(session, prompt, choice, text, mode, accept, temperature, top_p, seed, max_new_tokens):
            if "error" in ev:
                return {"error": ev["error"]}
            last = ev
        run = last["run"]
        return {"text": "".join(run.pieces), "token_ids": run.stream, "steps": len(run.traces),
                "mean_accepted": round(run.tokens / max(len(run.traces), 1), 4), "finish_reason": run.finish,
                "stats": last["stats"], "run_id": run.run_id}

    def validate_tree(self, session: Session, text: object) -> dict:
        msg, _, normal = self.editor.validate_tree(text, session)
        return {"valid": normal is not None, "message": msg, "tree": json.loads(normal) if normal else None}

    def optimize_tree(self, session: Session, nodes: object = 16, method: object = "replay") -> dict:
        tree_json, msg, _ = self.tune.optimize_tree(session, nodes, method)
        return {"tree": json.loads(tree_json), "message": msg} if tree_json else {"error": msg}

    def wire(self, page: Page) -> None:
        def api_generate(prompt: str, tree: str = trees.DEFAULT_TREE, mode: str = "medusa", accept: str = "greedy",
                         temperature: float = 0.7, top_p: float = 1.0, seed: float | None = None,
                         max_new_tokens: float = 64, model: str = "", request: gr.Request = None) -> dict:
            """Decode one prompt and return {text, token_ids, steps, mean_accepted, finish_reason, stats, run_id}
            or {error}. Every argument but the prompt has a default; tree is a preset, saved/NAME or tree JSON;
            model is one the page's model selector offers (empty: this client's model, at first the start-up one)."""
            return self.generate(page.session(request), prompt, tree, mode, accept, temperature, top_p, seed,
                                 max_new_tokens, model)

        def api_validate(text: str, request: gr.Request = None) -> dict:
            """Check a tree: {valid, message, tree (the paths in Medusa order, or null)}."""
            return self.validate_tree(page.session(request), text)

        def api_optimize(nodes: float = 16, method: str = "replay", request: gr.Request = None) -> dict:
            """The best tree of `nodes` nodes for this session's AR trace pool: {tree, message} or {error}."""
            return self.optimize_tree(page.session(request), nodes, method)

        with gr.Row(visible=False):
            prompt = gr.Textbox(label="prompt")
            tree = gr.Textbox(trees.DEFAULT_TREE, label="tree")
            mode = gr.Textbox("medusa", label="mode")
            accept = gr.Textbox("greedy", label="accept")
            temperature = gr.Number(0.7, label="temperature")
            top_p = gr.Number(1.0, label="top_p")
            seed = gr.Number(None, label="seed")
            max_new = gr.Number(64, label="max_new_tokens")
            model = gr.Textbox("", label="model")
            text = gr.Textbox(label="text")
            nodes = gr.Number(16, label="nodes")
            method = gr.Textbox("replay", label="method")
            out = gr.JSON()
            button = gr.Button()
        button.click(api_generate, [prompt, tree, mode, accept, temperature, top_p, seed, max_new, model], out,
                     api_name="generate", concurrency_limit=1, concurrency_id=ENGINE_QUEUE)
        text.submit(api_validate, text, out, api_name="validate_tree")
        nodes.submit(api_optimize, [nodes, method], out, api_name="optimize_tree")
