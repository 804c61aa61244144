"""Runs: two saved runs side by side, as a researcher compares a tree or a model change: their text,
tokens per step over the run, and each head's top-1 accuracy over the run (from the traces on disk)."""

from __future__ import annotations

import html

import gradio as gr

from .. import research_figures
from ..core import Workbench
from ..page import PRIVATE, Page
from ..session import RunState, Session, UserError, user_message
from ..store import StoreError


def head_accuracy_steps(run: RunState, steps: list[dict]) -> list[list[float | None]]:
    """Per step: each head's top-1 accuracy over the steps so far (RunState scores a head once the
    token it predicted has come)."""
    out = []
    for s in steps:
        run.add(s, s.get("accepted_text", ""))
        out.append([hit / n if n else None for hit, n in run.head_hits])
    return out


class RunsTab:
    title = "Runs"
    order = 50

    def __init__(self, wb: Workbench):
        self.wb = wb

    def side_by_side(self, run_a: object, run_b: object) -> tuple[str, str, str, object, object]:
        """-> (summary, text A, text B, tokens/step figure, head accuracy figure) of two saved runs."""
        loaded = []
        try:
            for rid in (run_a, run_b):
                if not rid:
                    raise UserError("choose two saved runs")
                summary, steps = self.wb.store.load_run(str(rid))
                run = RunState(summary["settings"])
                loaded.append((summary, steps, head_accuracy_steps(run, steps)))
        except (UserError, StoreError, KeyError, TypeError, ValueError, OSError) as e:
            return f"✗ {user_message(e)}", "", "", None, None
        names = ["A", "B"]
        per_step = [(n, [len(s["accepted_tokens"]) for s in steps]) for n, (_, steps, _) in zip(names, loaded)]
        acc = [(n, a) for n, (_, _, a) in zip(names, loaded)]
        lines = []
        for n, (summary, _, _) in zip(names, loaded):
            st = summary["settings"]
            lines.append(f"**{n}** `{summary['id']}` · model {st.get('model')} · {st.get('mode')} "
                         f"{len(st.get('tree') or [])} nodes · {st.get('accept')} · {summary['tokens']} tokens in "
                         f"{summary['steps']} steps ({summary['tokens_per_step']} tokens/step)")
        hashes = [s["settings"].get("prompt_sha256") for s, _, _ in loaded]
        same = ("same prompt (prompt_sha256 matches)" if hashes[0] and hashes[0] == hashes[1]
                else "different prompts" if all(hashes) else "prompt hash missing (a run saved before headers had it)")
        texts = [f"<pre class='out'>{html.escape(s['text'])}</pre>" for s, _, _ in loaded]
        return ("\n\n".join(lines) + f"\n\n{same}", *texts, research_figures.tokens_per_step_over_time(per_step),
                research_figures.head_accuracy_over_time(acc))

    def run_choices(self) -> list[tuple[str, str]]:
        return [(f"{r['created']} · {r['settings'].get('model', '')} · {r['settings'].get('mode')} "
                 f"{len(r['settings'].get('tree') or [])} nodes · {r['tokens_per_step']}/step", r["id"])
                for r in self.wb.store.list_runs()]

    def layout(self, page: Page) -> None:
        with gr.Row():
            self.a = gr.Dropdown([], label="run A", scale=3, elem_id="run-a")
            self.b = gr.Dropdown([], label="run B", scale=3, elem_id="run-b")
            self.refresh = gr.Button("↻ runs", scale=1, size="sm")
            self.show = gr.Button("Side by side", variant="primary", scale=1, elem_id="runs-show")
        self.summary = gr.Markdown(elem_id="runs-summary")
        with gr.Row():
            self.text_a = gr.HTML(label="A")
            self.text_b = gr.HTML(label="B")
        with gr.Row():
            self.per_step = gr.Plot(show_label=False, elem_id="runs-per-step")
            self.heads = gr.Plot(show_label=False, elem_id="runs-heads")
        page.figure_exports({"runs_tokens_per_step": self.per_step, "runs_head_accuracy": self.heads}, "runs")

    def wire(self, page: Page) -> None:
        def refresh():
            choices = self.run_choices()
            return gr.update(choices=choices), gr.update(choices=choices)

        self.refresh.click(refresh, None, [self.a, self.b], queue=False, **PRIVATE)
        self.show.click(self.side_by_side, [self.a, self.b],
                        [self.summary, self.text_a, self.text_b, self.per_step, self.heads], **PRIVATE)

    def load_outputs(self) -> list:
        return [self.a, self.b]

    def on_load(self, session: Session, editor_text: str) -> dict:
        """Both run pickers' choices when a page opens."""
        choices = self.run_choices()
        return {self.a: gr.update(choices=choices), self.b: gr.update(choices=choices)}


TAB = RunsTab
