"""Tune: collect AR traces into the session's pool, measure or load step times, optimise a tree into
the editor, and confirm it with a real run. Every job stops between decoding steps on the tab's Stop."""

from __future__ import annotations

import json
import time
from pathlib import Path

import gradio as gr

import trees
from engine.prompts import Prompt

from .. import figures, measure
from ..core import PROMPT_SOURCES, Workbench, each_prompt
from ..page import PRIVATE, Page
from ..session import Session, Stopped, UserError, finite_number, user_message, whole_number
from ..store import StoreError

# 63 and 64 both: on a GPU the 64-node step (65 tokens with the root) costs 2-4 % more than the 63-node one,
# mostly in attention (benchmarks/README.md, "Past 64 tokens", "Row tiles of 64"), so the curve should show that edge
SIZES = "4,8,12,16,24,32,48,63,64"
MEASURE_PROMPTS, MEASURE_TOKENS = 4, 64  # a step-time curve needs a few short runs, not the whole set
DEFAULT_BUDGET_S, MAX_BUDGET_S = 60, 1800


class TuneTab:
    title = "Tune"
    order = 30

    def __init__(self, wb: Workbench):
        self.wb = wb

    # -- what the events do ------------------------------------------------------------------------
    def collect(self, session: Session, prompts: list[Prompt], max_new_tokens: object, progress=None) -> str:
        """AR runs with traces (every head's top-k logged) on the prompt set; they become the session's
        trace pool (and are kept under pools/). Stop keeps the prompts that finished."""
        try:
            cfg = self.wb.config("ar", None, "greedy", 0.0, 1.0, None, max_new_tokens, session=session)
            self.wb.engine_of(session)
        except UserError as e:
            return f"✗ {e}"
        runs, lines, stopped = [], [], False
        with self.wb.job(session):
            try:
                for p in each_prompt(session, prompts, progress):
                    res = self.wb.generate(session, p.text, cfg)
                    header = {"type": "header", "schema_version": 1, "mode": "ar", "acceptance": "greedy",
                              "prompt_id": str(p.id), "model": self.wb.model_of(session)}
                    lines += [json.dumps(header)] + [json.dumps(t, ensure_ascii=False) for t in res.traces]
                    runs.append(trees.run_of_steps(res.traces, header))
            except Stopped:
                stopped = True
            except UserError as e:
                return f"✗ prompt {p.id!r}: {e}"
        if not runs:
            return "✗ stopped by user before any prompt finished"
        name = time.strftime("pool-%Y%m%d-%H%M%S")
        session.pool, session.pool_name = runs, name
        tokens = sum(r.n_tokens for r in runs)
        try:
            self.wb.store.save_pool(name, lines)
            kept = ""
        except (OSError, ValueError) as e:
            kept = f" (not saved to disk: {getattr(e, 'strerror', None) or e})"
        return (f"collected {tokens} AR steps from {len(runs)} prompts into pool {name!r}{kept}"
                + (" (stopped by user)" if stopped else "") + "; predictions now use it")

    def use_pool(self, session: Session, name: object) -> str:
        try:
            path = self.wb.store.pool_path(str(name or ""))
            runs = trees.ar_runs(trees.read_runs(path))
        except (StoreError, trees.TraceError) as e:
            return f"✗ {user_message(e)}"
        if not runs:
            return f"✗ pool {name!r} holds no AR runs"
        session.pool, session.pool_name = runs, str(name)
        return f"using pool {name!r}: {len(runs)} runs, {sum(r.n_tokens for r in runs)} steps"

    def measure_latency(self, session: Session, sizes: object, prompts: list[Prompt], max_new_tokens: object,
                        progress=None, budget_s: object = DEFAULT_BUDGET_S) -> tuple[str, list[list]]:
        """Mean step time of real runs at each size (best trees from the pool) and AR, within a time
        budget spent where the intervals are widest (workbench/measure.py). -> (message, table rows).
        Stop keeps what was measured; the message says how sure the curve is and the load it saw."""
        try:
            ns = sorted({int(x) for x in str(sizes).replace(" ", "").split(",") if x})
            if not ns or any(n < 1 or n > trees.MAX_NODES for n in ns):
                raise ValueError
        except ValueError:
            return f"✗ sizes must be comma-separated node counts in 1..{trees.MAX_NODES}, e.g. 4,8,16,32,64", []
        try:
            budget = float(finite_number(budget_s, "time budget"))
            if not 5 <= budget <= MAX_BUDGET_S:
                raise UserError(f"the time budget must be 5..{MAX_BUDGET_S} s, got {budget:g}")
            cfg = self.wb.config("ar", None, "greedy", 0.0, 1.0, None, max_new_tokens, trace=False, session=session)
            heads = self.wb.engine_of(session).num_heads
        except UserError as e:
            return f"✗ {e}", []
        if not heads:
            ns = []  # a model without heads has only its AR step to time
        samples: dict[int, list[float]] = {}
        t0, load_before, stopped, cut = time.monotonic(), measure.load_average(), False, 0
        deadline = t0 + budget  # everything below shares it: tree searches, warm-up and timed runs
        with self.wb.job(session):
            try:
                configs = {0: cfg}
                search_s = min(2.0, measure.SEARCH_SHARE * budget / max(len(ns), 1))
                for n in ns:
                    session.check_stop()
                    if time.monotonic() >= deadline:
                        break
                    tree = trees.best_tree(session.pool, n, max_depth=heads, time_limit=search_s) if session.pool \
                        else trees.chain(min(n, heads))
                    configs[n] = cfg.replace(mode="medusa", tree=tree)
                for c in configs.values():  # warm-up
                    if time.monotonic() >= deadline:
                        break
                    self.wb.generate(session, prompts[0].text, c.replace(max_new_tokens=min(8, c.max_new_tokens)),
                                     deadline)
                samples = {n: [] for n in configs}
                while time.monotonic() < deadline:
                    n = measure.next_size(samples)
                    r = self.wb.generate(session, prompts[len(samples[n]) % len(prompts)].text, configs[n], deadline)
                    if r.cut:  # a run cut short weighs its prefill over fewer steps: not a comparable sample
                        cut += 1
                        break
                    samples[n].append(1000 * r.wall_s / max(r.steps, 1))
                    if progress is not None:
                        progress(min(1.0, (time.monotonic() - t0) / budget), desc=f"timing {n or 'AR'}")
            except Stopped:
                stopped = True
            except UserError as e:
                return f"✗ {e}", []
        for n in [0, *ns]:  # sizes the budget ended before: said as not measured
            samples.setdefault(n, [])
        report = measure.Report(samples, time.monotonic() - t0, budget, load_before, measure.load_average(), stopped,
                                cut)
        curve = report.curve()
        if not curve or (ns and not set(curve) - {0}):  # a curve without a tree size chooses nothing
            what = "any size" if not curve else "any tree size (AR only)"
            if stopped:
                return f"✗ stopped by user before {what} was timed; the step-time curve is unchanged", []
            return (f"✗ the time budget of {budget:g} s ran out before {what} was timed (one run takes longer): "
                    "give more time or fewer new tokens; the step-time curve is unchanged", [])
        session.latency = curve
        session.latency_source = f"measured here, {len(prompts)} prompts"
        steps = ", ".join(f"{n or 'AR'}: {v['step_ms']:.2f}" for n, v in curve.items())
        return f"step ms: {steps}\n\n{report.confidence()}", measure.table(curve)

    def load_latency(self, session: Session, upload: object) -> str:
        path = getattr(upload, "name", upload)
        if not path:
            return "✗ upload a `bench --part latency` JSON first"
        try:
            session.latency = trees.latency_points(trees.read_json_file(path))
        except (trees.JsonInputError, ValueError) as e:
            return f"✗ {user_message(e)}"
        session.latency_source = f"loaded from {Path(str(path)).name}"
        return f"latency curve: {len(session.latency)} sizes ({', '.join(map(str, sorted(session.latency)))})"

    def optimize_tree(self, session: Session, nodes: object, method: object = "replay", by_latency: bool = False
                      ) -> tuple[str | None, str, object]:
        """-> (tree JSON or None, message, size-curve figure or None)."""
        if not session.pool:
            return None, "✗ no AR traces yet: collect traces in the Tune tab first", None
        try:
            n = whole_number(nodes, "nodes")
        except UserError as e:
            return None, f"✗ {e}", None
        if not 1 <= n <= trees.MAX_NODES:
            return None, f"✗ nodes must be between 1 and {trees.MAX_NODES}, got {n}", None
        if method not in ("replay", "position", "independent"):
            return None, f"✗ unknown optimiser {method!r}", None
        try:
            depth = self.wb.engine_of(session).num_heads or None
        except UserError as e:
            return None, f"✗ {e}", None
        curve_fig, note = None, ""
        if by_latency:
            if not session.latency:
                return None, "✗ no step times yet: measure or load a latency curve first", None
            rp = trees.Replay(session.pool)

            def e_of(k):
                found = trees.best_tree(session.pool, k, str(method), max_depth=depth, **(
                    {"replay": rp, "time_limit": 5.0} if method == "replay" else {}))
                return rp.tokens() / rp.steps({tuple(p) for p in found})

            try:
                choice = trees.select_size(e_of, session.latency, n)
            except ValueError as e:
                return None, f"✗ {user_message(e)}", None
            curve_fig = figures.size_curve_figure(choice.curve)
            if choice.nodes == 0:
                return None, (f"AR is fastest on this curve ({choice.tokens_per_s:.0f} tokens/s predicted, "
                              f"{choice.margin:+.1%} over {choice.runner_up} nodes): no tree pays here"), curve_fig
            n = choice.nodes
            note = (f" · size {n} chosen by E(n)/t(n): {choice.tokens_per_s:.0f} tokens/s predicted, "
                    f"{choice.margin:+.1%} over the runner-up ({choice.runner_up} nodes)")
        kw = {"time_limit": 20.0} if method == "replay" else {}
        t = trees.best_tree(session.pool, n, str(method), max_depth=depth, **kw)
        pred = self.wb.predict(session, t)
        return json.dumps(t), f"✓ {len(t)} nodes ({method} optimiser) · {pred.message}{note}", curve_fig

    def confirm_tree(self, session: Session, text: object, prompts: list[Prompt], max_new_tokens: object) -> str:
        """The prediction against a real greedy run of the tree on the same prompts."""
        try:
            choices = self.wb.parse_tree_text(text, session)
            cfg = self.wb.config("medusa", choices, "greedy", 0.0, 1.0, None, max_new_tokens, trace=False,
                                 session=session)
        except UserError as e:
            return f"✗ {e}"
        pred = self.wb.predict(session, choices)
        tokens = steps = done = 0
        wall = 0.0
        with self.wb.job(session):
            try:
                for p in each_prompt(session, prompts):
                    res = self.wb.generate(session, p.text, cfg)
                    wall, tokens, steps, done = wall + res.wall_s, tokens + res.new_tokens, steps + res.steps, done + 1
            except Stopped:
                if not done:
                    return "✗ stopped by user before any prompt finished"
            except UserError as e:
                return f"✗ prompt {p.id!r}: {e}"
        measured = tokens / steps
        parts = [f"{len(choices)} nodes on {done} prompts: measured {measured:.3f} tokens/step, {tokens / wall:.0f} tokens/s"]
        if done < len(prompts):
            parts.append(f"stopped by user after {done} of {len(prompts)} prompts")
        if pred.estimate is not None:
            err = 100 * (pred.estimate.value / measured - 1)
            parts.append(f"predicted {pred.estimate.value:.3f} ({err:+.1f} %; replay on the pool's prompts"
                         + (", exact when they are these prompts" if session.pool_name else "") + ")")
            if pred.tokens_per_s:
                parts.append(f"predicted {pred.tokens_per_s:.0f} tokens/s vs measured {tokens / wall:.0f}")
        else:
            parts.append(pred.message)
        return " · ".join(parts)

    # -- the page ----------------------------------------------------------------------------------
    def layout(self, page: Page) -> None:
        max_tokens = max(16, min(2048, self.wb.engine.max_seq_len - 16))
        with gr.Row():
            self.src = gr.Radio(PROMPT_SOURCES, value="held-out", label="prompt set")
            self.n_prompts = gr.Slider(1, 64, value=8, step=1, label="prompts")
            self.tokens = gr.Slider(16, max_tokens, value=128, step=16, label="tokens per prompt")
        with gr.Row():
            self.pasted = gr.Textbox(label="pasted prompts (JSONL with 'prompt'/'turns', or blocks separated by '---')",
                                     lines=3)
            self.upload = gr.File(label="prompt file (.jsonl or text)", file_types=[".jsonl", ".json", ".txt", ".md"])
        with gr.Row():
            self.collect_btn = gr.Button("Collect AR traces", variant="primary")
            self.stop_btn = gr.Button("Stop", variant="stop")
        self.collect_msg = gr.Markdown(elem_id="collect-msg")
        with gr.Row():
            self.pool_pick = gr.Dropdown([], label="saved trace pools")
            self.pool_btn = gr.Button("Use pool")
        self.acc_plot = gr.Plot(show_label=False)
        with gr.Row():
            self.sizes = gr.Textbox(SIZES, label="sizes to time (nodes)")
            self.budget = gr.Number(DEFAULT_BUDGET_S, label="time budget (s)", minimum=5, maximum=MAX_BUDGET_S,
                                    info="spent on the sizes whose intervals are widest")
            self.lat_btn = gr.Button("Measure step times here")
            self.lat_file = gr.File(label="or load `bench --part latency` JSON", file_types=[".json"])
        self.lat_msg = gr.Markdown(elem_id="lat-msg")
        self.lat_table = gr.Dataframe(headers=measure.TABLE_HEADERS, label="step times", interactive=False)
        page.table_downloads(self.lat_table, measure.TABLE_HEADERS, "step_times")
        with gr.Row():
            self.opt_nodes = gr.Slider(1, trees.MAX_NODES, value=16, step=1, label="tree nodes (the most, with latency)")
            self.opt_method = gr.Radio(["replay", "position", "independent"], value="replay", label="objective")
            self.opt_latency = gr.Checkbox(False, label="choose the size by E(n)/t(n)")
            self.opt_btn = gr.Button("Optimise → editor", variant="primary")
        self.opt_msg = gr.Markdown()
        self.size_plot = gr.Plot(show_label=False, visible=False, elem_id="tune-size-plot")
        page.figure_exports({"head_accuracy": self.acc_plot, "tree_size": self.size_plot}, "tune")
        self.confirm_btn = gr.Button("Confirm the editor's tree (real run on these prompts)")
        self.confirm_msg = gr.Markdown()

    def wire(self, page: Page) -> None:
        prompt_in = [self.src, self.pasted, self.upload, self.n_prompts, self.tokens]

        def collect(source, text, file, n, tokens, request: gr.Request, progress=gr.Progress()):
            session = page.session(request)
            try:
                prompts = self.wb.prompt_set(source, text, file, n)
            except UserError as e:
                return f"✗ {e}", gr.update(), gr.update()
            msg = self.collect(session, prompts, tokens, progress)
            vec = [v for r in session.pool for v in r.vectors]
            heads = self.wb.engine_of(session).num_heads
            fig = figures.head_accuracy_figure(trees.head_stats(vec, heads)) if vec and heads else gr.update()
            return msg, fig, gr.update(choices=self.wb.store.pool_names(), value=session.pool_name)

        page.job(self.collect_btn, collect, prompt_in, [self.collect_msg, self.acc_plot, self.pool_pick])
        page.stop_button(self.stop_btn)

        def use_pool(name, request: gr.Request):
            return self.use_pool(page.session(request), name)

        self.pool_btn.click(use_pool, self.pool_pick, self.collect_msg, **PRIVATE)

        def measure_times(sz, budget, source, text, file, n, tokens, request: gr.Request, progress=gr.Progress()):
            try:
                prompts = self.wb.prompt_set(source, text, file, min(whole_number(n, "prompts"), MEASURE_PROMPTS))
                tokens = min(whole_number(tokens, "tokens per prompt"), MEASURE_TOKENS)
            except UserError as e:
                return f"✗ {e}", gr.update()
            msg, rows = self.measure_latency(page.session(request), sz, prompts, tokens, progress, budget)
            return msg, rows if rows else gr.update()

        page.job(self.lat_btn, measure_times, [self.sizes, self.budget] + prompt_in, [self.lat_msg, self.lat_table])

        def load_latency(f, request: gr.Request):
            return self.load_latency(page.session(request), f)

        self.lat_file.upload(load_latency, self.lat_file, self.lat_msg, **PRIVATE)

        def optimise(n, method, by_latency, request: gr.Request):
            tree_json, msg, curve = self.optimize_tree(page.session(request), n, method, by_latency)
            return (tree_json or gr.update()), msg, gr.update(value=curve, visible=True) if curve is not None else gr.update()

        self.opt_btn.click(optimise, [self.opt_nodes, self.opt_method, self.opt_latency],
                           [page.editor, self.opt_msg, self.size_plot], **PRIVATE)

        def confirm(text, source, ptext, file, n, tokens, request: gr.Request):
            try:
                prompts = self.wb.prompt_set(source, ptext, file, n)
            except UserError as e:
                return f"✗ {e}"
            return self.confirm_tree(page.session(request), text, prompts, tokens)

        page.job(self.confirm_btn, confirm, [page.editor] + prompt_in, [self.confirm_msg])

    def load_outputs(self) -> list:
        return [self.pool_pick]

    def on_load(self, session: Session, editor_text: str) -> dict:
        """The pools dropdown when a page opens."""
        return {self.pool_pick: gr.update(choices=self.wb.store.pool_names())}


TAB = TuneTab
