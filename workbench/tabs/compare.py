"""Compare: two trees (or AR against a tree) on the same prompts, and every registered acceptance rule side
by side with their distance from the model's own sampling. Both jobs stop between decoding steps."""

from __future__ import annotations

from collections import Counter

import gradio as gr

from engine.accept import RULES
from engine.prompts import Prompt

from ..core import MODEL_TREE, PROMPT_SOURCES, Workbench, each_prompt
from ..page import ACCEPT_CHOICES, Page
from ..session import Session, Stopped, UserError, whole_number


def with_ar(names: list[str]) -> list[str]:
    return ["ar"] + names


def total_variation(a: list, b: list) -> float:
    """TV distance between two empirical distributions (lists of outcomes)."""
    ca, cb = Counter(a), Counter(b)
    return 0.5 * sum(abs(ca[k] / len(a) - cb[k] / len(b)) for k in set(ca) | set(cb))


class CompareTab:
    title = "Compare"

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
                                 round(res[0].tokens_per_s, 1), round(res[1].tokens_per_s, 1), same])
            except Stopped:
                stopped = True
            except UserError as e:
                return rows, f"✗ prompt {p.id!r}: {e}"
        if not rows:
            return [], "✗ stopped by user before any prompt finished"
        tp = [t[0] / t[1] for t in totals]
        speed = [t[0] / t[2] for t in totals]
        greedy = str(accept) == "greedy"
        verdict = ("greedy outputs identical on every prompt ✓" if same_all else "outputs differ ✗") if greedy else \
            "sampled outputs are not expected to match"
        return rows, (f"A {tp[0]:.3f} vs B {tp[1]:.3f} tokens/step; B/A speed {speed[1] / speed[0]:.2f}x "
                      f"over {len(rows)} prompts · {verdict}" + (" · stopped by user" if stopped else ""))

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
        self.table = gr.Dataframe(headers=["prompt", "A tokens/step", "B tokens/step", "A tokens/s", "B tokens/s",
                                           "same output"], interactive=False)
        self.msg = gr.Markdown(elem_id="cmp-msg")
        gr.Markdown("**Acceptance rules** on the same prompts and tree: greedy and sample are lossless, typical is "
                    "not. Distance = total variation from the model's own sampling (first 2 tokens).")
        with gr.Row():
            self.rules_tree = page.tree_dropdown("tree", MODEL_TREE)
            self.rules_temp = gr.Slider(0.05, 2, value=0.7, step=0.05, label="temperature")
            self.rules_samples = gr.Slider(4, 128, value=32, step=4, label="samples per prompt and rule")
            self.rules_btn = gr.Button("Compare acceptance rules")
        self.rules_table = gr.Dataframe(headers=["rule", "lossless", "tokens/step", "TV to AR sampling"], interactive=False)
        self.rules_msg = gr.Markdown()

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
