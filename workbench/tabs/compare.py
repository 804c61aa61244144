"""Compare: two trees (or AR against a tree) on the same prompts, and every registered acceptance rule side
by side with their distance from the model's own sampling (both jobs stop between decoding steps); static
against dynamic trees replayed on the session's traces; and a recorded batch sweep (where Medusa stops
paying as the batch grows)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import gradio as gr

import trees
from engine.accept import RULES
from engine.prompts import Prompt

from .. import research_figures, sweeps
from ..core import MODEL_TREE, PROMPT_SOURCES, Workbench, each_prompt
from ..page import ACCEPT_CHOICES, PRIVATE, Page
from ..session import Session, Stopped, UserError, user_message, whole_number

COMPARE_HEADERS = ["prompt", "A tokens/step", "B tokens/step", "A tokens/s", "B tokens/s", "same output"]
RULES_HEADERS = ["rule", "lossless", "tokens/step", "TV to AR sampling"]
DYNAMIC_HEADERS = ["nodes", "static tokens/step", "dynamic rule", "dynamic tokens/step", "gain %", "gain ci95 low",
                   "gain ci95 high", "prompts"]
MAX_DYNAMIC_NODES = 128


def describe_paired(what: str, p: trees.Paired) -> str:
    ci = f" [{100 * p.ci95[0]:+.1f}, {100 * p.ci95[1]:+.1f}] %" if p.ci95 else ""
    return (f" · B over A, {what}: {100 * p.gain:+.1f} %{ci} (95 %, paired over {p.prompts} prompts; "
            f"B better on {p.b_better}, A on {p.a_better})")


def paired_note(what: str, a: list[tuple[int, int]], b: list[tuple[int, int]]) -> str:
    """B's tokens/step gain over A on the same prompts with a paired interval, or '' when undefined."""
    try:
        return describe_paired(what, trees.paired(a, b, samples=500))
    except ValueError:
        return ""


def with_ar(names: list[str]) -> list[str]:
    return ["ar"] + names


def total_variation(a: list, b: list) -> float:
    """TV distance between two empirical distributions (lists of outcomes)."""
    ca, cb = Counter(a), Counter(b)
    return 0.5 * sum(abs(ca[k] / len(a) - cb[k] / len(b)) for k in set(ca) | set(cb))


class CompareTab:
    title = "Compare"
    order = 40

    def __init__(self, wb: Workbench):
        self.wb = wb

    # -- what the events do ------------------------------------------------------------------------
    def compare(self, session: Session, a: object, b: object, editor_text: object, prompts: list[Prompt],
                max_new_tokens: object, accept: object, temperature: object, seed: object, progress=None
                ) -> tuple[list[list], str]:
        """Two trees (or AR) on the same prompts, timed alternately: tokens/step, tokens/s, same output."""
        try:
            runs = [None if c == "ar" else self.wb.resolve_choice(c, editor_text, session) for c in (a, b)]
            cfgs = [self.wb.config("ar" if t is None else "medusa", t, accept, temperature, 1.0, seed, max_new_tokens,
                                   trace=False, session=session) for t in runs]
        except UserError as e:
            return [], f"✗ {e}"
        rows, same_all, stopped = [], True, False
        totals = [[0, 0, 0.0], [0, 0, 0.0]]
        with self.wb.job(session):
            try:
                for p in each_prompt(session, prompts, progress):
                    res = [self.wb.generate(session, p.text, c) for c in cfgs]
                    for total, r in zip(totals, res):
                        total[0], total[1], total[2] = total[0] + r.new_tokens, total[1] + r.steps, total[2] + r.wall_s
                    same = res[0].token_ids == res[1].token_ids
                    same_all &= same
                    rows.append([str(p.id), round(res[0].mean_accepted, 3), round(res[1].mean_accepted, 3),
                                 round(res[0].tokens_per_s, 1), round(res[1].tokens_per_s, 1), same,
                                 (res[0].new_tokens, res[0].steps), (res[1].new_tokens, res[1].steps)])
            except Stopped:
                stopped = True
            except UserError as e:
                return rows, f"✗ prompt {p.id!r}: {e}"
        if not rows:
            return [], "✗ stopped by user before any prompt finished"
        walks = [[(r[6][0], r[6][1]) for r in rows], [(r[7][0], r[7][1]) for r in rows]]
        rows = [r[:6] for r in rows]
        tp = [t[0] / t[1] for t in totals]
        speed = [t[0] / t[2] for t in totals]
        greedy = str(accept) == "greedy"
        verdict = ("greedy outputs identical on every prompt ✓" if same_all else "outputs differ ✗") if greedy else \
            "sampled outputs are not expected to match"
        return rows, (f"A {tp[0]:.3f} vs B {tp[1]:.3f} tokens/step; B/A speed {speed[1] / speed[0]:.2f}x "
                      f"over {len(rows)} prompts · {verdict}" + (" · stopped by user" if stopped else "")
                      + paired_note("measured", walks[0], walks[1]) + self.replayed_note(session, runs))

    def replayed_note(self, session: Session, choices: list) -> str:
        """B against A replayed on the session's AR traces (greedy), paired over their prompts."""
        if not session.pool or None in choices:  # AR has nothing to replay
            return ""
        try:
            p = trees.compare_trees(session.pool, choices[0], choices[1], samples=500)
        except (ValueError, trees.TreeError):
            return ""
        return describe_paired(f"replayed on {session.pool_name or 'the pool'}", p)

    def static_vs_dynamic(self, session: Session, sizes: object, time_limit: float = 3.0
                          ) -> tuple[list[list], str, object]:
        """Static vs dynamic trees of equal node counts, replayed on the session's AR traces
        (trees.static_vs_dynamic: every dynamic figure paired against the static tree). -> (rows, message, figure)."""
        if not session.pool:
            return [], "✗ no AR traces yet: collect traces in the Tune tab first", None
        try:
            ns = sorted({int(x) for x in str(sizes).replace(" ", "").split(",") if x})
            if not ns or any(n < 1 or n > MAX_DYNAMIC_NODES for n in ns):
                raise ValueError
        except ValueError:
            return [], f"✗ sizes must be comma-separated node counts in 1..{MAX_DYNAMIC_NODES}, e.g. 8,16,32,64", None
        try:
            heads = self.wb.engine_of(session).num_heads or None
            found = trees.static_vs_dynamic(session.pool, ns, samples=500, max_depth=heads, time_limit=time_limit)
        except (ValueError, UserError) as e:
            return [], f"✗ {user_message(e)}", None
        rows = [[r["nodes"], r["static"]["tokens_per_step"], rule, d["b_tokens_per_step"], d["gain_pct"],
                 *(d["gain_pct_ci95"] or [None, None]), d["prompts"]]
                for r in found for rule, d in r["dynamic"].items()]
        note = (" (static trees tuned on the same traces: in-sample, so the static figure is flattered)"
                if found and found[0]["in_sample"] else "")
        return rows, (f"{len(session.pool)} AR runs of {session.pool_name or 'this session'}{note}; gain = dynamic "
                      "over static tokens/step, 95 % interval resampling prompts jointly"), \
            research_figures.static_vs_dynamic_figure(found)

    def compare_rules(self, session: Session, tree_choice: object, editor_text: object, prompts: list[Prompt],
                      temperature: object, samples: object = 32, prefix_tokens: int = 2, max_new_tokens: int = 64
                      ) -> tuple[list[list], str]:
        """Every registered acceptance rule on the same prompts and tree: mean tokens per step, and the total
        variation distance of each rule's first tokens from the model's own sampling (the row
        "AR vs AR", two independent AR sample sets, is the noise floor a lossless rule sits at)."""
        try:
            tree = self.wb.resolve_choice(tree_choice, editor_text, session)
            if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature <= 2:
                raise UserError(f"temperature must be in (0, 2] to compare sampling rules, got {temperature!r}")
            n_samples = whole_number(samples, "samples")
            if not 1 <= n_samples <= 256:
                raise UserError("samples must be 1..256")
            prefix = self.wb.config("ar", None, "sample", temperature, 1.0, None, prefix_tokens, trace=False,
                                    session=session)
            whole = prefix.replace(mode="medusa", tree=tree, max_new_tokens=max_new_tokens, seed=1)
        except UserError as e:
            return [], f"✗ {e}"
        rules = tuple(RULES)  # every registered rule gets a row
        tv: dict[str, list[float]] = {r: [] for r in rules + ("AR vs AR",)}
        per_step = {r: [0, 0] for r in rules}
        with self.wb.job(session):
            try:
                for p in each_prompt(session, prompts):
                    def draws(seed0: int, **change) -> list[tuple]:
                        return [tuple(self.wb.generate(session, p.text, prefix.replace(seed=seed0 + i, **change)).token_ids)
                                for i in range(n_samples)]

                    ref = draws(0)
                    tv["AR vs AR"].append(total_variation(ref, draws(10_000)))
                    for rule in per_step:
                        tv[rule].append(total_variation(ref, draws(20_000, mode="medusa", tree=tree, accept=rule)))
                        res = self.wb.generate(session, p.text, whole.replace(accept=rule))
                        per_step[rule][0] += res.new_tokens
                        per_step[rule][1] += res.steps
            except Stopped:
                return [], "✗ stopped by user: the rules were not compared on every prompt"
            except UserError as e:
                return [], f"✗ prompt {p.id!r}: {e}"
        lossless = {name: rule.lossless for name, rule in RULES.items()} | {"AR vs AR": "(noise floor)"}
        rows = [[r, lossless[r], round(per_step[r][0] / per_step[r][1], 3) if r in per_step else None,
                 round(sum(v) / len(v), 3)] for r, v in tv.items()]
        return rows, (f"{len(prompts)} prompts, {n_samples} samples each, first {prefix_tokens} tokens, "
                      f"T = {float(temperature)}; greedy ignores the temperature (it is exact for T = 0)")

    @staticmethod
    def batch_sweep(picked: object, uploaded: object) -> tuple[list[list], str, object]:
        """A recorded `bench --part batch` file (an uploaded one, else one of the repository's) as a table
        and a figure. -> (rows, message, figure or None)."""
        recorded = sweeps.recorded_sweeps()
        if uploaded:
            path = uploaded
        elif picked in recorded:  # only the listed files: the page's value could be any path
            path = picked
        else:
            return [], "✗ pick a recorded sweep or upload a `python -m engine bench --part batch` JSON file", None
        try:
            sweep = sweeps.read_sweep(path)
        except UserError as e:
            return [], f"✗ {e}", None
        rows = sweeps.sweep_rows(sweep)
        losing = [str(r[0]) for r in rows if r[5] is not None and r[5] < 1]
        untried = [str(r[0]) for r in rows if r[5] is None]  # no tree there: neither a win nor a loss
        said = ([f"AR beats every tree at batch {', '.join(losing)}"] if losing else []) + (
            [f"no tree was run at batch {', '.join(untried)}"] if untried else [])
        verdict = "; ".join(said) or "a tree beats AR at every batch size recorded"
        return rows, f"{sweep['title']}: {verdict}", research_figures.batch_sweep_figure(sweep)

    # -- the page ----------------------------------------------------------------------------------
    def layout(self, page: Page) -> None:
        max_tokens = max(8, min(2048, self.wb.engine.max_seq_len - 16))
        with gr.Row():
            self.a = page.tree_dropdown("A", "ar", with_ar)
            self.b = page.tree_dropdown("B", MODEL_TREE, with_ar)
            self.src = gr.Radio(PROMPT_SOURCES, value="held-out", label="prompt set")
            self.n = gr.Slider(1, 64, value=4, step=1, label="prompts")
        with gr.Row():
            self.pasted = gr.Textbox(label="pasted prompts", lines=2)
            self.upload = gr.File(label="prompt file", file_types=[".jsonl", ".json", ".txt", ".md"])
        with gr.Row():
            self.tokens = gr.Slider(8, max_tokens, value=64, step=8, label="tokens per prompt")
            self.accept = gr.Radio(ACCEPT_CHOICES, value="greedy", label="acceptance")
            self.temp = gr.Slider(0, 2, value=0.7, step=0.05, label="temperature")
            self.seed = gr.Number(value=0, precision=0, label="seed", minimum=0)
        with gr.Row():
            self.cmp_btn = gr.Button("Compare", variant="primary")
            self.stop_btn = gr.Button("Stop", variant="stop")
        self.table = gr.Dataframe(headers=COMPARE_HEADERS, interactive=False)
        page.table_downloads(self.table, COMPARE_HEADERS, "compare")
        self.msg = gr.Markdown(elem_id="cmp-msg")
        gr.Markdown("**Acceptance rules** on the same prompts and tree: greedy and sample are lossless, typical is "
                    "not. Distance = total variation from the model's own sampling (first 2 tokens).")
        with gr.Row():
            self.rules_tree = page.tree_dropdown("tree", MODEL_TREE)
            self.rules_temp = gr.Slider(0.05, 2, value=0.7, step=0.05, label="temperature")
            self.rules_samples = gr.Slider(4, 128, value=32, step=4, label="samples per prompt and rule")
            self.rules_btn = gr.Button("Compare acceptance rules")
        self.rules_table = gr.Dataframe(headers=RULES_HEADERS, interactive=False)
        page.table_downloads(self.rules_table, RULES_HEADERS, "rules")
        self.rules_msg = gr.Markdown(elem_id="rules-msg")
        gr.Markdown("**Static vs dynamic trees** at equal node counts, replayed on this session's AR traces (Tune → "
                    "Collect): the static tree is the replay optimum; a dynamic tree is drafted each step from the "
                    "heads' probabilities (product = EAGLE-2's rule; calibrated = fitted on the traces).")
        with gr.Row():
            self.dyn_sizes = gr.Textbox("8,16,32,64", label="node counts", elem_id="dyn-sizes")
            self.dyn_btn = gr.Button("Static vs dynamic", elem_id="dyn-btn")
        self.dyn_msg = gr.Markdown(elem_id="dyn-msg")
        self.dyn_table = gr.Dataframe(headers=DYNAMIC_HEADERS, interactive=False, elem_id="dyn-table")
        page.table_downloads(self.dyn_table, DYNAMIC_HEADERS, "static_vs_dynamic")
        self.dyn_plot = gr.Plot(show_label=False, elem_id="dyn-plot")
        page.figure_exports({"static_vs_dynamic": self.dyn_plot}, "dynamic")
        gr.Markdown("**Batch sweep** from a recorded `python -m engine bench --part batch` file: tokens/s of our "
                    "AR and of each tree as the batch grows, and where Medusa stops paying.")
        recorded = sweeps.recorded_sweeps()
        with gr.Row():
            self.sweep_pick = gr.Dropdown([(Path(p).name, p) for p in recorded], value=recorded[-1] if recorded else None,
                                          label="recorded sweep", elem_id="sweep-pick")
            self.sweep_file = gr.File(label="or a sweep file", file_types=[".json"], elem_id="sweep-file")
            self.sweep_btn = gr.Button("Show sweep", elem_id="sweep-btn")
        self.sweep_msg = gr.Markdown(elem_id="sweep-msg")
        self.sweep_table = gr.Dataframe(headers=sweeps.SWEEP_HEADERS, interactive=False, elem_id="sweep-table")
        page.table_downloads(self.sweep_table, sweeps.SWEEP_HEADERS, "batch_sweep")
        self.sweep_plot = gr.Plot(show_label=False, elem_id="sweep-plot")
        page.figure_exports({"batch_sweep": self.sweep_plot}, "sweep")

    def load_outputs(self) -> list:
        return []

    def on_load(self, session: Session, editor_text: str) -> dict:
        """Nothing to refresh when a page opens."""
        return {}

    def wire(self, page: Page) -> None:
        def compare(a, b, text, source, ptext, file, n, tokens, acc, temp, sd, request: gr.Request,
                    progress=gr.Progress()):
            try:
                prompts = self.wb.prompt_set(source, ptext, file, n)
            except UserError as e:
                return [], f"✗ {e}"
            return self.compare(page.session(request), a, b, text, prompts, tokens, acc, temp, sd, progress)

        page.job(self.cmp_btn, compare, [self.a, self.b, page.editor, self.src, self.pasted, self.upload, self.n,
                                         self.tokens, self.accept, self.temp, self.seed], [self.table, self.msg])
        page.stop_button(self.stop_btn)

        def rules(tree, text, source, ptext, file, n, temp, samples, request: gr.Request):
            try:
                prompts = self.wb.prompt_set(source, ptext, file, n)
            except UserError as e:
                return [], f"✗ {e}"
            return self.compare_rules(page.session(request), tree, text, prompts, temp, samples)

        page.job(self.rules_btn, rules, [self.rules_tree, page.editor, self.src, self.pasted, self.upload, self.n,
                                         self.rules_temp, self.rules_samples], [self.rules_table, self.rules_msg])

        def dynamic(sizes, request: gr.Request):
            rows, msg, fig = self.static_vs_dynamic(page.session(request), sizes)
            return rows, msg, fig if fig is not None else gr.update()

        self.dyn_btn.click(dynamic, self.dyn_sizes, [self.dyn_table, self.dyn_msg, self.dyn_plot], concurrency_limit=1,
                           concurrency_id="replay", **PRIVATE)

        def sweep(picked, uploaded):
            rows, msg, fig = self.batch_sweep(picked, uploaded)
            return rows, msg, fig if fig is not None else gr.update()

        self.sweep_btn.click(sweep, [self.sweep_pick, self.sweep_file], [self.sweep_table, self.sweep_msg,
                                                                         self.sweep_plot], **PRIVATE)


TAB = CompareTab
