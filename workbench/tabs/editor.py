"""Tree editor: the tree as JSON and by node edits, live validation and prediction, save, download,
export and diff. Its JSON (`page.editor`) is the `(tree editor)` choice of every other tab."""

from __future__ import annotations

import json

import gradio as gr

import trees
from trees.estimate import accepted_length

from .. import figures
from ..core import EDITOR, MODEL_TREE, Workbench
from ..page import PRIVATE, Page
from ..session import Session, UserError, whole_number
from ..store import StoreError, safe_name


class EditorTab:
    title = "Tree editor"
    order = 20

    def __init__(self, wb: Workbench):
        self.wb = wb

    # -- what the events do ------------------------------------------------------------------------
    def validate_tree(self, text: object, session: Session | None = None) -> tuple[str, object, str | None]:
        """-> (message, figure or None, normalised tree JSON or None). The message names the failed rule."""
        try:
            choices = self.wb.parse_tree_text(text, session)
        except UserError as e:
            return f"✗ {e}", None, None
        msg = f"✓ valid: {len(choices)} nodes, depth {max(len(p) for p in choices)}"
        reach, title = None, ""
        if session is not None and session.pool:
            msg += f" · {self.wb.predict(session, choices).message}"
            reach, title = reach_probabilities(session, choices), "P(step keeps node), replay"
        return msg, figures.tree_figure(choices, reach, title), json.dumps(choices)

    def edit_tree(self, text: object, op: str, path_text: object, rank: object, session: Session | None = None
                  ) -> tuple[str, str]:
        """Node edits: add child / add sibling / delete subtree. -> (new JSON, message)."""
        try:
            eng = self.wb.engine_of(session)
            choices = [tuple(p) for p in self.wb.parse_tree_text(text, session)]
            raw = trees.parse_json(path_text if isinstance(path_text, str) and path_text.strip() else "[]", "node path")
            if not isinstance(raw, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in raw):
                raise UserError("the node path must be a list of ranks, e.g. [0, 1] ([] is the root)")
            path = tuple(raw)
            if op != "delete subtree":
                whole_number(rank, "the rank")
        except (UserError, trees.JsonInputError) as e:
            return text if isinstance(text, str) else "", f"✗ {e}"
        if op == "delete subtree":
            if not path:
                return text, "✗ choose a node to delete, not the root"
            kept = [p for p in choices if p[: len(path)] != path]
            if not kept:
                return text, "✗ that would leave an empty tree: a tree needs at least one path"
            return json.dumps([list(p) for p in trees.sort_paths(kept)]), f"deleted {list(path)} and its subtree"
        if op == "add child":
            new = path + (int(rank),)
        elif op == "add sibling":
            if not path:
                return text, "✗ the root has no siblings"
            new = path[:-1] + (int(rank),)
        else:
            return text, f"✗ unknown edit {op!r}"
        try:
            out = trees.resolve([list(p) for p in choices] + [list(new)], topk=eng.topk,
                                num_heads=eng.num_heads or None)
        except trees.TreeError as e:
            return text, f"✗ {e}"
        return json.dumps(out), f"added {list(new)}"

    def save_tree(self, name: object, text: object, overwrite: bool = False, session: Session | None = None
                  ) -> tuple[str, str | None]:
        try:
            choices = self.wb.parse_tree_text(text, session)
            clean = safe_name(name)
            eng = self.wb.engine_of(session)
        except (UserError, StoreError) as e:
            return f"✗ {e}", None
        pred = self.wb.predict(session, choices) if session is not None else None
        est = pred.estimate if pred else None
        tf = trees.TreeFile(choices, num_heads=eng.num_heads or None, topk=eng.topk, name=clean,
                            expected_accepted=round(est.value, 4) if est else None, estimator="replay" if est else "",
                            source=f"medusa-workbench tree editor ({eng.name})", extra={"estimate": est.to_json()} if est else {})
        try:
            path = self.wb.store.save_tree(tf, overwrite=bool(overwrite))
        except FileExistsError:
            return f"✗ a different tree is already saved as {clean!r}: tick overwrite or pick another name", None
        except (OSError, trees.OutputPathError) as e:
            return f"✗ could not save: {getattr(e, 'strerror', None) or e}", None
        return f"✓ saved as saved/{clean}", str(path)

    def export_tree(self, text: object, fmt: str) -> tuple[str, str]:
        """(the export text, what of the tree the target's engine will not keep): the warnings go beside
        the text, not into it, so the text stays what the target parses (`trees.export_warnings`)."""
        try:
            choices = self.wb.parse_tree_text(text)
        except UserError as e:
            return f"✗ {e}", ""
        if fmt not in ("trtllm", "vllm", "json"):
            return f"✗ unknown export format {fmt!r}", ""
        out = {"trtllm": trees.to_trtllm, "vllm": trees.to_vllm, "json": json.dumps}[fmt](choices)
        warnings = trees.export_warnings(choices, fmt) if fmt != "json" else []
        return out, "\n\n".join(f"⚠ {w}" for w in warnings)

    def diff_trees(self, a: object, b: object, editor_text: object, session: Session | None = None) -> str:
        try:
            ta, tb = self.wb.resolve_choice(a, editor_text, session), self.wb.resolve_choice(b, editor_text, session)
        except UserError as e:
            return f"✗ {e}"
        est = None
        if session is not None and session.pool:
            rp = trees.Replay(session.pool)

            def est(t):
                return rp.tokens() / rp.steps({tuple(p) for p in t})

        d = trees.diff(ta, tb, est)
        delta = f", Δ replayed tokens/step = {d.delta_expected:+.3f}" if d.delta_expected is not None else ""
        return f"kept {d.kept}; added {len(d.added)}: {d.added}; removed {len(d.removed)}: {d.removed}{delta}"

    def first_tree(self) -> list[list[int]]:
        """The editor's tree when a page opens: the started model's own default (Medusa's default for a
        model without heads, whose trees are only drawn and exported)."""
        try:
            return self.wb.resolve_choice(MODEL_TREE, "")
        except UserError:
            return trees.preset(trees.DEFAULT_TREE)

    # -- the page ----------------------------------------------------------------------------------
    def layout(self, page: Page) -> None:
        with gr.Row():
            with gr.Column(scale=2):
                self.editor = page.editor = gr.Code(value=json.dumps(self.first_tree()), language="json",
                                                    label="medusa_choices", lines=8, max_lines=16, wrap_lines=True,
                                                    elem_id="tree-json")
                self.valid_msg = gr.Markdown(elem_id="valid-msg")
                with gr.Row():
                    self.load_pick = page.tree_dropdown("load a tree", MODEL_TREE, lambda names: names[1:])
                    self.load_btn = gr.Button("Load into editor")
                with gr.Row():
                    self.edit_path = gr.Textbox(label="node path, e.g. [0, 1] ([] = root)", value="[0]")
                    self.edit_rank = gr.Number(label="rank", value=0, precision=0, minimum=0, maximum=1023)
                    self.edit_op = gr.Radio(["add child", "add sibling", "delete subtree"], value="add child", label="edit")
                self.edit_btn = gr.Button("Apply edit")
                with gr.Row():
                    self.save_name = gr.Textbox(label="save as", value="my_tree")
                    self.overwrite = gr.Checkbox(label="overwrite", value=False)
                    self.save_btn = gr.Button("Save")
                self.save_msg = gr.Markdown()
                self.download = gr.File(label="download JSON", height=70)
                with gr.Row():
                    self.export_fmt = gr.Radio(["trtllm", "vllm", "json"], value="vllm", label="export for")
                    self.export_btn = gr.Button("Export")
                self.export_out = gr.Textbox(label="export", lines=2)
                self.export_warn = gr.Markdown()
                with gr.Row():
                    self.diff_a = page.tree_dropdown("diff: from", "mc_sim_7b_63")
                    self.diff_b = page.tree_dropdown("to", EDITOR)
                    self.diff_btn = gr.Button("Diff")
                self.diff_out = gr.Markdown()
            with gr.Column(scale=3):
                self.plot = gr.Plot(show_label=False, elem_id="editor-plot")
                page.figure_exports({"editor_tree": self.plot}, "editor")

    def wire(self, page: Page) -> None:
        def validate(text, request: gr.Request):
            msg, fig, _ = self.validate_tree(text, page.session(request))
            return msg, fig if fig is not None else gr.update()

        self.editor.change(validate, self.editor, [self.valid_msg, self.plot], **PRIVATE)

        def load_into_editor(choice, request: gr.Request):
            try:
                return json.dumps(self.wb.resolve_choice(choice, "[]", page.session(request)))
            except UserError as e:
                gr.Warning(str(e))
                return gr.update()

        self.load_btn.click(load_into_editor, self.load_pick, self.editor, **PRIVATE)
        def edit(text, op, path, rank, request: gr.Request):
            return self.edit_tree(text, op, path, rank, page.session(request))

        self.edit_btn.click(edit, [self.editor, self.edit_op, self.edit_path, self.edit_rank],
                            [self.editor, self.valid_msg], **PRIVATE)

        def save(name, text, ow, request: gr.Request):
            msg, path = self.save_tree(name, text, ow, page.session(request))
            return [msg, path] + page.dropdown_updates()

        self.save_btn.click(save, [self.save_name, self.editor, self.overwrite],
                            [self.save_msg, self.download] + page.tree_dropdowns, **PRIVATE)
        self.export_btn.click(self.export_tree, [self.editor, self.export_fmt], [self.export_out, self.export_warn],
                              **PRIVATE)

        def diff(a, b, t, request: gr.Request):
            return self.diff_trees(a, b, t, page.session(request))

        self.diff_btn.click(diff, [self.diff_a, self.diff_b, self.editor], self.diff_out, **PRIVATE)

    def load_outputs(self) -> list:
        return [self.valid_msg, self.plot]

    def on_load(self, session: Session, editor_text: str) -> dict:
        """The check and drawing of the tree the editor opens with."""
        msg, fig, _ = self.validate_tree(editor_text, session)
        return {self.valid_msg: msg, self.plot: fig if fig is not None else gr.update()}


def reach_probabilities(session: Session, choices: list[list[int]]) -> list[float]:
    """Per node: the share of replayed step starts whose accepted path reached it."""
    rp = trees.Replay(session.pool)
    tree = {tuple(p) for p in choices}
    hits = dict.fromkeys(tree, 0)
    starts = 0
    for chains in rp.chains:
        i = 0
        while i < len(chains):
            starts += 1
            keep = accepted_length(tree, chains[i])
            for d in range(keep):
                hits[chains[i][d]] += 1
            i += 1 + keep
    return [hits[tuple(p)] / max(starts, 1) for p in choices]


TAB = EditorTab
