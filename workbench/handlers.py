"""What the app's events do, as plain functions over one Engine (testable without a browser).

Every user error comes back as a message string, never an exception: the UI shows it and stays
usable. Trees are JSON only (never evaluated as Python); saved trees go under the app's data folder
with sanitised names, written atomically.
"""

from __future__ import annotations

import html
import json
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import trees
from engine import Engine, GenerationError
from engine.prompts import heldout_prompts

from . import figures

log = logging.getLogger("workbench")
MAX_PROMPT_CHARS = 20_000
STEP_COLORS = ["#e3f2fd", "#fff3e0", "#e8f5e9", "#fce4ec", "#ede7f6", "#f1f8e9"]
EDITOR = "(tree editor)"
MAX_LOGGED_STEPS = 50_000  # rank vectors kept for the Tune tab (a few MiB); older steps are dropped


class UserError(ValueError):
    """Shown to the user as a message."""


@dataclass
class Workbench:
    engine: Engine
    data_dir: Path
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop_event: threading.Event = field(default_factory=threading.Event)
    # per-step head ranks of the most recent decoded steps (Tune, predictions): bounded, so a
    # long-running app does not grow; whole traces are not kept, only what the estimators read
    rank_log: deque = field(default_factory=lambda: deque(maxlen=MAX_LOGGED_STEPS))

    def log_run(self, traces: list[dict]) -> None:
        self.rank_log.extend(trees.rank_vectors(traces))

    @property
    def tree_dir(self) -> Path:
        d = self.data_dir / "trees"
        d.mkdir(parents=True, exist_ok=True)
        return d

    # -- trees -------------------------------------------------------------------------------
    def tree_names(self) -> list[str]:
        return [EDITOR] + trees.names() + sorted(f"saved/{p.stem}" for p in self.tree_dir.glob("*.json"))

    def parse_tree_text(self, text: str) -> list[list[int]]:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
        try:
            return trees.resolve(trees.parse_tree(obj, where="tree").medusa_choices, num_heads=self.engine.num_heads or None)
        except trees.TreeError as e:
            raise UserError(str(e)) from None

    def resolve_choice(self, choice: str, editor_text: str) -> list[list[int]]:
        if choice == EDITOR:
            return self.parse_tree_text(editor_text)
        if choice.startswith("saved/"):
            return trees.load_tree(self.tree_dir / f"{safe_name(choice[6:])}.json").medusa_choices
        try:
            return trees.preset(choice)
        except trees.TreeError as e:
            raise UserError(str(e)) from None

    def head_accuracy(self):
        vec = list(self.rank_log)
        return (trees.head_stats(vec, self.engine.num_heads).accuracy(), len(vec)) if vec else (None, 0)

    def validate_tree(self, text: str) -> tuple[str, object, str]:
        """-> (message, figure, normalised JSON). The message names the failed rule."""
        try:
            choices = self.parse_tree_text(text)
        except UserError as e:
            return f"✗ {e}", None, text
        acc, n = self.head_accuracy()
        msg = f"✓ valid: {len(choices)} nodes, depth {max((len(p) for p in choices), default=0)}"
        if acc:
            msg += f"; predicted {trees.expected_independent(choices, acc):.3f} tokens/step (from {n} logged steps)"
        return msg, figures.tree_figure(choices, acc), json.dumps(choices)

    def edit_tree(self, text: str, op: str, path_text: str, rank: int) -> tuple[str, str]:
        """Node-table edits: add child / add sibling / delete subtree. -> (new JSON, message)."""
        try:
            choices = [tuple(p) for p in self.parse_tree_text(text)]
            path = tuple(json.loads(path_text or "[]"))
        except (UserError, json.JSONDecodeError, TypeError) as e:
            return text, f"✗ {e}"
        if op == "add child":
            new = path + (int(rank),)
        elif op == "add sibling":
            if not path:
                return text, "✗ the root has no siblings"
            new = path[:-1] + (int(rank),)
        elif op == "delete subtree":
            if not path:
                return text, "✗ choose a node to delete, not the root"
            kept = [p for p in choices if p[: len(path)] != path]
            return json.dumps([list(p) for p in trees.sort_paths(kept)]), f"deleted {list(path)} and its subtree"
        else:
            return text, f"✗ unknown edit {op!r}"
        try:
            out = trees.validate([list(p) for p in choices] + [list(new)], num_heads=self.engine.num_heads or None)
        except trees.TreeError as e:
            return text, f"✗ {e}"
        return json.dumps([list(p) for p in out]), f"added {list(new)}"

    def save_tree(self, name: str, text: str, overwrite: bool = False) -> tuple[str, str | None]:
        try:
            choices = self.parse_tree_text(text)
            clean = safe_name(name)
        except UserError as e:
            return f"✗ {e}", None
        acc, _ = self.head_accuracy()
        tf = trees.TreeFile(choices, num_heads=self.engine.num_heads or None, name=clean,
                            expected_accepted=round(trees.expected_independent(choices, acc), 4) if acc else None,
                            estimator="independent" if acc else "", source="medusa-workbench tree editor")
        try:
            path = trees.save_tree(tf, self.tree_dir / f"{clean}.json", overwrite=overwrite)
        except FileExistsError:
            return f"✗ a different tree is already saved as {clean!r}: tick overwrite or pick another name", None
        return f"✓ saved as saved/{clean}", str(path)

    def export_tree(self, text: str, fmt: str) -> str:
        try:
            choices = self.parse_tree_text(text)
        except UserError as e:
            return f"✗ {e}"
        return {"trtllm": trees.to_trtllm, "vllm": trees.to_vllm}[fmt](choices)

    def diff_trees(self, a: str, b: str, editor_text: str) -> str:
        try:
            ta, tb = self.resolve_choice(a, editor_text), self.resolve_choice(b, editor_text)
        except (UserError, trees.TreeError) as e:
            return f"✗ {e}"
        acc, _ = self.head_accuracy()
        d = trees.diff(ta, tb, acc)
        delta = f", ΔE = {d.delta_expected:+.3f}" if d.delta_expected is not None else ""
        return f"kept {d.kept}; added {len(d.added)}: {d.added}; removed {len(d.removed)}: {d.removed}{delta}"

    # -- decoding ----------------------------------------------------------------------------
    def check_prompt(self, prompt: str) -> str:
        if not isinstance(prompt, str) or not prompt.strip():
            raise UserError("the prompt is empty")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise UserError(f"the prompt has {len(prompt)} characters; the limit is {MAX_PROMPT_CHARS}")
        return prompt

    def stream(self, prompt: str, tree_choice: str, editor_text: str, mode: str, accept: str, temperature: float,
               max_new_tokens: int) -> Iterator[dict]:
        """One dict per step: html, traces, figures' inputs, stats; or {'error': msg} once."""
        try:
            prompt = self.check_prompt(prompt)
            tree = self.resolve_choice(tree_choice, editor_text) if mode == "medusa" else None
            events = self.engine.stream(prompt, int(max_new_tokens), mode=mode, tree=tree, accept=accept,
                                        temperature=float(temperature), trace=True, seed=0)
            self.stop_event.clear()
            pieces: list[tuple[int, str]] = []
            traces: list[dict] = []
            t0 = time.perf_counter()
            with self.lock:  # one decode at a time on the one engine
                for ev in events:
                    pieces.append((ev.step, ev.text))
                    traces.append(ev.trace)
                    tokens = sum(len(t["accepted_tokens"]) for t in traces)
                    wall = time.perf_counter() - t0
                    yield {"html": colour_by_step(pieces), "traces": traces,
                           "stats": f"{tokens} tokens, {len(traces)} steps, {tokens / len(traces):.2f} tokens/step, "
                                    f"{tokens / wall:.1f} tokens/s" + (f", stopped: {ev.finish_reason}" if ev.done else "")}
                    if self.stop_event.is_set():
                        break
            self.log_run(traces)
        except (UserError, GenerationError, trees.TreeError) as e:
            yield {"error": str(e)}
        except Exception as e:  # a bug, not bad input: say so, log the trace, keep serving
            log.exception("decode failed")
            yield {"error": f"internal error ({type(e).__name__}: {e}); the app is still running"}

    def collect(self, n_prompts: int, max_new_tokens: int) -> str:
        """Tune tab: AR runs with traces on bundled held-out prompts (every head's top-k is logged)."""
        steps = 0
        with self.lock:
            for p in heldout_prompts(int(n_prompts)):
                res = self.engine.generate(p, int(max_new_tokens), mode="ar", trace=True)
                self.log_run(res.traces)
                steps += res.steps
        acc, n = self.head_accuracy()
        return f"collected {steps} steps from {int(n_prompts)} prompts; {n} logged steps in all"

    def optimize_tree(self, nodes: int, estimator: str = "empirical") -> tuple[str, str]:
        """-> (tree JSON, message)."""
        vec = list(self.rank_log)
        if not vec:
            return "", "✗ no logged steps yet: decode something or collect traces in the Tune tab first"
        nodes = int(nodes)
        if not 1 <= nodes <= 256:
            return "", f"✗ nodes must be between 1 and 256, got {nodes}"
        if estimator == "empirical":
            t = trees.best_tree_position(vec, nodes, max_depth=self.engine.num_heads)
            e = trees.expected_position(t, [vec])
        else:
            acc = trees.head_stats(vec, self.engine.num_heads).accuracy()
            t = trees.best_tree_independent(acc, nodes)
            e = trees.expected_independent(t, acc)
        return json.dumps(t), f"✓ {len(t)} nodes, estimated {e:.3f} tokens/step ({estimator}, {len(vec)} steps)"


    def confirm_tree(self, text: str, n_prompts: int, max_new_tokens: int) -> str:
        """Tune: predicted tokens/step (from the traces so far) against a real greedy run of the tree."""
        try:
            choices = self.parse_tree_text(text)
        except UserError as e:
            return f"✗ {e}"
        vec = list(self.rank_log)
        predicted = trees.expected_position(choices, [vec]) if vec else None
        tokens = steps = 0
        with self.lock:
            for p in heldout_prompts(int(n_prompts)):
                res = self.engine.generate(p, int(max_new_tokens), mode="medusa", tree=choices)
                tokens, steps = tokens + res.new_tokens, steps + res.steps
        pred = f"predicted {predicted:.3f}" if predicted is not None else "no prediction (no traces yet)"
        return f"{len(choices)} nodes: {pred}, measured {tokens / steps:.3f} tokens/step over {steps} steps"


    def compare(self, a: str, b: str, n_prompts: int, editor_text: str) -> tuple[list[list], str]:
        """Two trees (or AR) on the same held-out prompts: tokens/step, tokens/s, identical output."""
        try:
            runs = [None if c == "ar" else self.resolve_choice(c, editor_text) for c in (a, b)]
        except (UserError, trees.TreeError) as e:
            return [], f"✗ {e}"
        rows, same_all = [], True
        with self.lock:
            for i, p in enumerate(heldout_prompts(int(n_prompts))):
                res = [self.engine.generate(p, 64, mode="ar" if t is None else "medusa", tree=t) for t in runs]
                same = res[0].token_ids == res[1].token_ids
                same_all &= same
                rows.append([i, round(res[0].mean_accepted, 3), round(res[1].mean_accepted, 3),
                             round(res[0].tokens_per_s, 1), round(res[1].tokens_per_s, 1), same])
        return rows, "greedy outputs identical on every prompt ✓" if same_all else "outputs differ ✗"

    def compare_rules(self, tree_choice: str, editor_text: str, n_prompts: int, temperature: float,
                      samples: int = 32, prefix_tokens: int = 2, max_new_tokens: int = 64) -> tuple[list[list], str]:
        """The three acceptance rules on the same prompts and tree: mean accepted tokens per step,
        and how far each rule's output distribution is from the model's own sampling.

        Distance: total variation between the empirical distributions of the first `prefix_tokens`
        tokens from `samples` seeded runs of the rule and as many runs of plain AR sampling at the
        same temperature, averaged over prompts. Sample-based TV is biased upwards at small sample
        counts, so the row "AR vs AR" (two independent AR sample sets) is the noise floor: a
        lossless rule sits at it, a lossy one above it.
        """
        try:
            tree = self.resolve_choice(tree_choice, editor_text)
            temperature = float(temperature)
            if not 0 < temperature <= 2:
                raise UserError(f"temperature must be in (0, 2] to compare sampling rules, got {temperature}")
            samples, n_prompts = int(samples), int(n_prompts)
            if not (1 <= samples <= 256 and 1 <= n_prompts <= 24):
                raise UserError("samples must be 1..256 and prompts 1..24")
        except (UserError, trees.TreeError, ValueError) as e:
            return [], f"✗ {e}"
        rules = ("greedy", "typical", "sample")
        tv = {r: [] for r in rules + ("AR vs AR",)}
        per_step = {r: [0, 0] for r in rules}
        with self.lock:
            for p in heldout_prompts(n_prompts):
                def draws(mode, accept, seed0):
                    return [tuple(self.engine.generate(p, prefix_tokens, mode=mode, tree=tree, accept=accept,
                                                       temperature=temperature, seed=seed0 + i).token_ids)
                            for i in range(samples)]

                ref = draws("ar", "sample", 0)
                tv["AR vs AR"].append(total_variation(ref, draws("ar", "sample", 10_000)))
                for r in rules:
                    tv[r].append(total_variation(ref, draws("medusa", r, 20_000)))
                    res = self.engine.generate(p, max_new_tokens, mode="medusa", tree=tree, accept=r,
                                               temperature=temperature, seed=1)
                    per_step[r][0] += res.new_tokens
                    per_step[r][1] += res.steps
        lossless = {"greedy": "yes, for greedy decoding (T = 0) only", "typical": "no",
                    "sample": "yes, at any temperature", "AR vs AR": "(noise floor)"}
        rows = [[r, lossless[r], round(per_step[r][0] / per_step[r][1], 3) if r in per_step else None,
                 round(sum(tv[r]) / len(tv[r]), 3)] for r in tv]
        return rows, (f"{n_prompts} prompts, {samples} samples each, first {prefix_tokens} tokens, T = {temperature}; "
                      "greedy ignores the temperature (it is exact for T = 0)")


def total_variation(a: list, b: list) -> float:
    """TV distance between two empirical distributions (lists of outcomes)."""
    from collections import Counter

    ca, cb = Counter(a), Counter(b)
    return 0.5 * sum(abs(ca[k] / len(a) - cb[k] / len(b)) for k in set(ca) | set(cb))


def safe_name(name: str) -> str:
    """A file stem with no path parts: letters, digits, '-', '_' and '.', not starting with '.'."""
    clean = re.sub(r"[^A-Za-z0-9._-]+", "_", (name or "").strip()).strip("._")[:64]
    if not clean:
        raise UserError("give the tree a name (letters, digits, '-', '_')")
    return clean


def colour_by_step(pieces: list[tuple[int, str]]) -> str:
    spans = [f'<span title="step {s}" style="background:{STEP_COLORS[s % len(STEP_COLORS)]}">{html.escape(t)}</span>'
             for s, t in pieces]
    return '<pre style="white-space:pre-wrap;font-size:14px">' + "".join(spans) + "</pre>"


def step_view(traces: list[dict], step: int):
    """Scrubber: (tree figure, head figure, node table rows) of one step."""
    if not traces:
        return None, None, []
    step = max(0, min(int(step), len(traces) - 1))
    annotated = figures.with_next_tokens(traces)[step]
    rows = figures.node_rows(annotated)
    table = [[r["node"], str(r["path"]), r["token_text"], r["head_prob"], r["path_prob"], r["status"], r["why"]] for r in rows]
    return figures.step_tree_figure(annotated), figures.head_topk_figure(annotated), table


def example_prompt() -> str:
    """The README's CLI prompt, so the app and `python -m engine generate` start in the same place."""
    return "def read_config(path):"


def default_data_dir() -> Path:
    return Path.home() / ".medusa-workbench"
