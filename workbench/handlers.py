"""What the app's events do, as plain functions over one Engine (testable without a browser).

Every user error comes back as a message, never an exception; only a real bug is called an
internal error (and logged). State is per browser session (`Sessions`, keyed by Gradio's session
hash): its run, its Stop flag, its trace pool and latency curve, so one user's Stop or traces never
touch another's. The engine is shared and runs one decode at a time (`Workbench.lock`).
"""

from __future__ import annotations

import html
import json
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import trees
from engine import Engine, GenerationConfig, GenerationError
from engine.accept import RULES
from engine.prompts import Prompt, PromptFileError, heldout_prompts, parse_prompts, read_prompts
from trees.estimate import accepted_length

from . import figures
from .store import Store, StoreError, safe_name

log = logging.getLogger("workbench")
MAX_PROMPT_CHARS = 20_000
MAX_SESSIONS = 64  # sessions whose state is kept; the least recently used beyond this are forgotten
MAX_RUNS_IN_MEMORY = 8  # sessions whose last run's traces stay in memory (all runs are on disk)
THROTTLE_S = 0.2  # streamed text and stats: at most five updates a second, whatever the step rate
FIGURE_S = 1.0  # the live step tree and head panel: at most one redraw a second
MAX_JOB_PROMPTS = 256
EDITOR = "(tree editor)"
STEP_CLASSES = 6


class UserError(ValueError):
    """Shown to the user as a message."""


def user_message(e: BaseException) -> str:
    return " ".join(str(e).split("\n")) or type(e).__name__


def whole_number(v: object, what: str) -> int:
    """A count or seed from the UI or API (an int, or a float with no fraction): never truncated."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise UserError(f"{what} must be a whole number, got {v!r}")
    return int(v)


def finite_number(v: object, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise UserError(f"{what} must be a number, got {v!r}")
    return float(v)


# -- per-session state ----------------------------------------------------------------------------
@dataclass
class RunState:
    """One decode run as the session sees it; every update is O(step)."""

    settings: dict
    traces: list[dict] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)  # text each step added
    stream: list[int] = field(default_factory=list)
    head_hits: list[list[int]] = field(default_factory=list)  # per head: [top-1 right, resolved]
    pending: list[list] = field(default_factory=list)  # [stream index of root, heads' top-1, heads resolved]
    finish: str | None = None
    wall_s: float = 0.0
    run_id: str | None = None

    def add(self, trace: dict, text: str) -> None:
        start = len(self.stream)
        self.traces.append(trace)
        self.pieces.append(text)
        self.stream.extend(trace["accepted_tokens"])
        heads = trace.get("head_topk") or []
        if heads:
            while len(self.head_hits) < len(heads):
                self.head_hits.append([0, 0])
            self.pending.append([start, [h[0]["token"] for h in heads], 0])
        for entry in self.pending:  # score each head once the token it predicted has come
            root, top1, k = entry
            while k < len(top1) and root + 1 + k < len(self.stream):
                self.head_hits[k][0] += top1[k] == self.stream[root + 1 + k]
                self.head_hits[k][1] += 1
                k += 1
            entry[2] = k
        self.pending = [e for e in self.pending if e[2] < len(e[1])]

    @property
    def tokens(self) -> int:
        return len(self.stream)

    def stats(self) -> str:
        n = len(self.traces)
        if not n:
            return "no steps yet"
        rate = f", {self.tokens / self.wall_s:.1f} tokens/s" if self.wall_s > 0 else ""
        end = {"eos": "stopped: end of text", "length": "stopped: length", "user": "stopped by user"}.get(self.finish or "", "")
        return (f"{self.tokens} tokens, {n} steps, {self.tokens / n:.2f} tokens/step{rate}" + (f" · {end}" if end else ""))


@dataclass
class Session:
    stop: threading.Event = field(default_factory=threading.Event)
    run: RunState | None = None
    pool: list[trees.Run] = field(default_factory=list)  # AR traces: the estimators' input
    pool_name: str = ""
    latency: dict[int, dict] | None = None  # measured step times by tree size (trees.latency_points)
    latency_source: str = ""


class Sessions:
    """Per-browser-session state, least recently used forgotten beyond MAX_SESSIONS."""

    def __init__(self, default_pool: Callable[[], tuple[list[trees.Run], str]]):
        self._items: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()
        self._default_pool = default_pool

    def get(self, sid: str | None) -> Session:
        sid = sid or "default"
        with self._lock:
            s = self._items.get(sid)
            if s is None:
                pool, name = self._default_pool()
                s = self._items[sid] = Session(pool=list(pool), pool_name=name)
            self._items.move_to_end(sid)
            while len(self._items) > MAX_SESSIONS:
                self._items.popitem(last=False)
            for old in list(self._items.values())[:-MAX_RUNS_IN_MEMORY]:
                old.run = None  # its traces are on disk (runs/)
            return s

    def __len__(self) -> int:
        return len(self._items)


# -- text ------------------------------------------------------------------------------------------
def step_span(step: int, text: str, selected: bool = False) -> str:
    cls = f"s{step % STEP_CLASSES}" + (" sel" if selected else "")
    return f'<span class="{cls}" data-step="{step}" title="step {step}">{html.escape(text)}</span>'


def text_html(pieces: list[str], selected: int | None = None) -> str:
    return "".join(step_span(i, t, i == selected) for i, t in enumerate(pieces))


@dataclass
class Prediction:
    estimate: trees.Estimate | None
    tokens_per_s: float | None
    step_ms: float | None
    size_used: int | None
    message: str


class Workbench:
    def __init__(self, engine: Engine, data_dir: Path, default_traces: Path | None = None):
        self.engine = engine
        self.store = Store(data_dir)
        self.lock = threading.Lock()  # one decode at a time on the one engine
        self.default_traces = default_traces
        self._default_pool_cache: tuple[list[trees.Run], str] | None = None
        self.sessions = Sessions(self._default_pool)

    @property
    def data_dir(self) -> Path:
        return self.store.root

    def _default_pool(self) -> tuple[list[trees.Run], str]:
        if self._default_pool_cache is None:
            runs, name = [], ""
            if self.default_traces is not None and Path(self.default_traces).exists():
                runs, name = trees.ar_runs(trees.read_runs(self.default_traces)), Path(self.default_traces).name
            self._default_pool_cache = (runs, name)
        return self._default_pool_cache

    # -- trees -------------------------------------------------------------------------------------
    def tree_names(self) -> list[str]:
        return [EDITOR] + trees.names() + [f"saved/{n}" for n in self.store.tree_names()]

    def parse_tree_text(self, text: object) -> list[list[int]]:
        """Tree JSON typed or pasted by a user (never a file path or a Python literal), checked by the
        one validator against this engine's topk and head count."""
        if not isinstance(text, str) or not text.strip():
            raise UserError("the tree is empty: write a list of paths, e.g. [[0], [0, 0], [1]]")
        try:
            obj = trees.parse_json(text, "tree")
            if not isinstance(obj, (list, dict)):
                raise trees.TreeError("a tree must be a JSON list of paths (or a schema-1 object)")
            return trees.resolve(obj, topk=self.engine.topk, num_heads=self.engine.num_heads or None)
        except (trees.TreeError, trees.JsonInputError) as e:
            raise UserError(user_message(e)) from None

    def resolve_choice(self, choice: object, editor_text: object) -> list[list[int]]:
        if choice == EDITOR:
            return self.parse_tree_text(editor_text)
        if not isinstance(choice, str) or not choice:
            raise UserError("choose a tree")
        try:
            if choice.startswith("saved/"):
                found = self.store.load_tree(choice[len("saved/"):]).medusa_choices
            else:
                found = trees.preset(choice)
            return trees.resolve(found, topk=self.engine.topk, num_heads=self.engine.num_heads or None)
        except (trees.TreeError, StoreError) as e:
            raise UserError(user_message(e)) from None

    def predict(self, session: Session, choices: list[list[int]]) -> Prediction:
        """The one prediction the editor, Tune and Compare show: replayed tokens/step on the session's
        AR trace pool with a bootstrap interval over prompts, and tokens/s where a step time was measured."""
        if not session.pool:
            return Prediction(None, None, None, None, "no prediction: no AR traces yet (Tune → Collect traces)")
        est = trees.estimate(choices, session.pool, "replay", samples=300)
        msg = f"predicted {est.describe()} of {session.pool_name or 'this session'}"
        tps = ms = used = None
        if session.latency:
            n = len(choices)
            sizes = sorted(k for k in session.latency if k >= n)
            if sizes:
                used = sizes[0]
                ms = session.latency[used]["step_ms"]
                tps = 1000 * est.value / ms
                bound = "" if used == n else f" (at most: the step time of the {used}-node size)"
                msg += f"; {tps:.0f} tokens/s at {ms:.2f} ms/step{bound} [{session.latency_source}]"
            else:
                msg += f"; no step time measured at {n} nodes or more"
        return Prediction(est, tps, ms, used, msg)

    def validate_tree(self, text: object, session: Session | None = None) -> tuple[str, object, str | None]:
        """-> (message, figure or None, normalised tree JSON or None). The message names the failed rule."""
        try:
            choices = self.parse_tree_text(text)
        except UserError as e:
            return f"✗ {e}", None, None
        msg = f"✓ valid: {len(choices)} nodes, depth {max(len(p) for p in choices)}"
        reach, title = None, ""
        if session is not None and session.pool:
            pred = self.predict(session, choices)
            msg += f" · {pred.message}"
            reach, title = self.reach_probabilities(session, choices), "P(step keeps node), replay"
        return msg, figures.tree_figure(choices, reach, title), json.dumps(choices)

    def reach_probabilities(self, session: Session, choices: list[list[int]]) -> list[float]:
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

    def edit_tree(self, text: object, op: str, path_text: object, rank: object) -> tuple[str, str]:
        """Node edits: add child / add sibling / delete subtree. -> (new JSON, message)."""
        try:
            choices = [tuple(p) for p in self.parse_tree_text(text)]
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
            out = trees.resolve([list(p) for p in choices] + [list(new)], topk=self.engine.topk,
                                num_heads=self.engine.num_heads or None)
        except trees.TreeError as e:
            return text, f"✗ {e}"
        return json.dumps(out), f"added {list(new)}"

    def save_tree(self, name: object, text: object, overwrite: bool = False, session: Session | None = None
                  ) -> tuple[str, str | None]:
        try:
            choices = self.parse_tree_text(text)
            clean = safe_name(name)
        except (UserError, StoreError) as e:
            return f"✗ {e}", None
        pred = self.predict(session, choices) if session is not None else None
        est = pred.estimate if pred else None
        tf = trees.TreeFile(choices, num_heads=self.engine.num_heads or None, topk=self.engine.topk, name=clean,
                            expected_accepted=round(est.value, 4) if est else None, estimator="replay" if est else "",
                            source=f"medusa-workbench tree editor ({self.engine.name})",
                            extra={"estimate": est.to_json()} if est else {})
        try:
            path = self.store.save_tree(tf, overwrite=bool(overwrite))
        except FileExistsError:
            return f"✗ a different tree is already saved as {clean!r}: tick overwrite or pick another name", None
        except OSError as e:
            return f"✗ could not save: {e.strerror or e}", None
        return f"✓ saved as saved/{clean}", str(path)

    def export_tree(self, text: object, fmt: str) -> str:
        try:
            choices = self.parse_tree_text(text)
        except UserError as e:
            return f"✗ {e}"
        if fmt not in ("trtllm", "vllm", "json"):
            return f"✗ unknown export format {fmt!r}"
        return {"trtllm": trees.to_trtllm, "vllm": trees.to_vllm, "json": json.dumps}[fmt](choices)

    def diff_trees(self, a: object, b: object, editor_text: object, session: Session | None = None) -> str:
        try:
            ta, tb = self.resolve_choice(a, editor_text), self.resolve_choice(b, editor_text)
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

    # -- decoding ------------------------------------------------------------------------------------
    def check_prompt(self, prompt: object) -> str:
        if not isinstance(prompt, str) or not prompt.strip():
            raise UserError("the prompt is empty")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise UserError(f"the prompt has {len(prompt)} characters; the limit is {MAX_PROMPT_CHARS}")
        return prompt

    def config(self, mode: object, tree: list[list[int]] | None, accept: object, temperature: object, top_p: object,
               seed: object, max_new_tokens: object, trace: bool = True) -> GenerationConfig:
        """A checked GenerationConfig from UI values (numbers may arrive as floats)."""
        seed = None if seed is None or seed == "" else whole_number(seed, "seed")
        cfg = GenerationConfig(max_new_tokens=whole_number(max_new_tokens, "max new tokens"), mode=str(mode), tree=tree,
                               accept=str(accept), temperature=finite_number(temperature, "temperature"),
                               top_p=finite_number(top_p, "top_p"), seed=seed, trace=trace)
        try:
            return cfg.validate()
        except GenerationError as e:
            raise UserError(str(e)) from None

    def decode(self, session: Session, prompt: object, tree_choice: object, editor_text: object, mode: object = "medusa",
               accept: object = "greedy", temperature: object = 0.7, top_p: object = 1.0, seed: object = 0,
               max_new_tokens: object = 96) -> Iterator[dict]:
        """Stream one run for one session. Yields small updates, throttled: {"html": the text so far
        (Gradio sends only what was appended), "stats", "steps", "trace" (when a figure redraw is due,
        else None), "done"}; or {"error": message} once. The session's Stop ends it within one step."""
        try:
            prompt = self.check_prompt(prompt)
            tree = self.resolve_choice(tree_choice, editor_text) if mode == "medusa" else None
            cfg = self.config(mode, tree, accept, temperature, top_p, seed, max_new_tokens)
        except UserError as e:
            yield {"error": str(e)}
            return
        if session.stop.is_set():  # Stop was pressed before this run left the queue
            session.stop.clear()
            yield {"error": "stopped by user before the run started"}
            return
        settings = {"prompt": prompt, "mode": cfg.mode, "tree": tree, "accept": cfg.accept,
                    "temperature": cfg.temperature, "top_p": cfg.top_p, "seed": cfg.seed,
                    "max_new_tokens": cfg.max_new_tokens, "model": self.engine.name}
        run = session.run = RunState(settings)
        last_text = last_fig = 0.0
        events = None
        try:
            with self.lock:
                t0 = time.perf_counter()
                events = self.engine.stream(prompt, config=cfg)
                for ev in events:
                    if ev.trace is not None:
                        run.add(ev.trace, ev.text)
                    run.wall_s = time.perf_counter() - t0
                    if ev.done:
                        run.finish = ev.finish_reason
                    if session.stop.is_set():
                        run.finish = "user"
                        events.close()
                        break
                    now = time.monotonic()
                    if ev.done or now - last_text >= THROTTLE_S:
                        fig_due = ev.done or now - last_fig >= FIGURE_S
                        yield {"html": text_html(run.pieces), "stats": run.stats(), "steps": len(run.traces),
                               "trace": run.traces[-1] if fig_due else None, "done": False}
                        last_text = now
                        last_fig = now if fig_due else last_fig
                session.stop.clear()
        except (GenerationError, trees.TreeError) as e:
            yield {"error": user_message(e)}
            return
        except Exception as e:  # a bug, not bad input: say so, log the traceback, keep serving
            log.exception("decode failed")
            yield {"error": f"internal error ({type(e).__name__}: {e}); the app is still running"}
            return
        finally:
            if events is not None:
                events.close()  # an abandoned stream (client gone) still finishes the engine's step in flight
        if run.traces:
            run.run_id = self.store.save_run(settings, run.traces, "".join(run.pieces))
        yield {"html": text_html(run.pieces), "stats": run.stats(), "steps": len(run.traces),
               "trace": run.traces[-1] if run.traces else None, "done": True}

    def stop(self, session: Session) -> None:
        session.stop.set()

    def step_view(self, session: Session, step: object, view: figures.TreeView = figures.TreeView()):
        """(tree figure, head panel, node table rows) of one step of the session's run."""
        run = session.run
        if run is None or not run.traces:
            return None, None, []
        try:
            step = max(0, min(int(step), len(run.traces) - 1))
        except (TypeError, ValueError):
            step = len(run.traces) - 1
        tr = run.traces[step]
        rows = figures.node_rows(tr)
        table = [[r["node"], json.dumps(r["path"]), r["token_text"], r["head_prob"], r["path_prob"], r["status"], r["why"]]
                 for r in rows]
        acc = [tuple(h) for h in run.head_hits]
        return (figures.step_tree_figure(tr, view), figures.head_panel(tr, figures.next_tokens(run.traces, step), acc),
                table)

    def run_figures(self, session: Session, selected: int | None = None):
        """(run chart, acceptance heatmap, calibration) of the session's run."""
        run = session.run
        if run is None or not run.traces:
            return None, None, None
        per_step = [len(t["accepted_tokens"]) for t in run.traces]
        depth = max((len(p) for p in run.traces[0]["tree"]), default=0)
        accepted = [len(t["accepted_nodes"]) - 1 for t in run.traces]
        return (figures.run_chart(per_step, selected), figures.acceptance_heatmap(accepted, depth) if depth else None,
                figures.calibration_figure(run.traces))

    def load_run(self, session: Session, run_id: object) -> str:
        try:
            summary, steps = self.store.load_run(str(run_id or ""))
        except (StoreError, trees.TraceError, OSError, ValueError) as e:
            return f"✗ {user_message(e)}"
        run = RunState(summary["settings"], run_id=summary["id"], finish="length")
        for s in steps:
            run.add(s, s.get("accepted_text", ""))
        run.pieces = [s.get("accepted_text", "") for s in steps]
        session.run = run
        return f"loaded run {summary['id']}: {run.stats()}"

    def run_choices(self) -> list[tuple[str, str]]:
        out = []
        for r in self.store.list_runs():
            s = r.get("settings", {})
            label = (f"{r['created']} · {s.get('mode')} {len(s.get('tree') or [])} nodes · {r['tokens']} tok, "
                     f"{r['tokens_per_step']}/step · {str(s.get('prompt', ''))[:30]!r}")
            out.append((label, r["id"]))
        return out

    # -- prompt sets and jobs ------------------------------------------------------------------------
    def prompt_set(self, source: object, pasted: object, upload: object, count: object) -> list[Prompt]:
        """The prompts a Tune / Compare job runs: bundled held-out prompts, pasted text (JSONL, or blocks
        separated by '---' lines), or an uploaded file of either kind."""
        n = whole_number(count, "the number of prompts")
        if not 1 <= n <= MAX_JOB_PROMPTS:
            raise UserError(f"the number of prompts must be in 1..{MAX_JOB_PROMPTS}, got {n}")
        try:
            if source == "pasted":
                if not isinstance(pasted, str) or not pasted.strip():
                    raise UserError("paste prompts first (JSONL lines with 'prompt' or 'turns', or text blocks "
                                    "separated by '---' lines)")
                found = parse_prompts(pasted, "pasted prompts")
            elif source == "file":
                path = getattr(upload, "name", upload)
                if not path:
                    raise UserError("upload a prompt file first (.jsonl, or text with '---' separators)")
                found = read_prompts(path)
            else:
                found = [Prompt(t, [t], i) for i, t in enumerate(heldout_prompts(n))]
        except PromptFileError as e:
            raise UserError(user_message(e)) from None
        for p in found:
            if len(p.text) > MAX_PROMPT_CHARS:
                raise UserError(f"prompt {p.id!r} has {len(p.text)} characters; the limit is {MAX_PROMPT_CHARS}")
        return found[:n]

    def collect(self, session: Session, prompts: list[Prompt], max_new_tokens: object, progress=None) -> str:
        """Tune: AR runs with traces (every head's top-k logged) on the prompt set; they become the
        session's trace pool (and are kept under pools/)."""
        try:
            cfg = self.config("ar", None, "greedy", 0.0, 1.0, None, max_new_tokens)
        except UserError as e:
            return f"✗ {e}"
        runs, lines = [], []
        session.stop.clear()
        with self.lock:
            for i, p in enumerate(prompts):
                if session.stop.is_set():
                    break
                if progress is not None:
                    progress((i, len(prompts)), desc=f"prompt {i + 1}/{len(prompts)}")
                try:
                    res = self.engine.generate(p.text, config=cfg)
                except GenerationError as e:
                    return f"✗ prompt {p.id!r}: {e}"
                header = {"type": "header", "schema_version": 1, "mode": "ar", "acceptance": "greedy", "prompt_id": str(p.id)}
                lines += [json.dumps(header)] + [json.dumps(t, ensure_ascii=False) for t in res.traces]
                runs.append(trees.run_of_steps(res.traces, header))
        stopped = session.stop.is_set()
        session.stop.clear()
        if not runs:
            return "✗ stopped before any prompt finished"
        name = time.strftime("pool-%Y%m%d-%H%M%S")
        self.store.save_pool(name, lines)
        session.pool, session.pool_name = runs, name
        tokens = sum(r.n_tokens for r in runs)
        return (f"collected {tokens} AR steps from {len(runs)} prompts into pool {name!r}"
                + (" (stopped by user)" if stopped else "") + "; predictions now use it")

    def use_pool(self, session: Session, name: object) -> str:
        try:
            path = self.store.pool_path(str(name or ""))
            runs = trees.ar_runs(trees.read_runs(path))
        except (StoreError, trees.TraceError) as e:
            return f"✗ {user_message(e)}"
        if not runs:
            return f"✗ pool {name!r} holds no AR runs"
        session.pool, session.pool_name = runs, str(name)
        return f"using pool {name!r}: {len(runs)} runs, {sum(r.n_tokens for r in runs)} steps"

    def measure_latency(self, session: Session, sizes: object, prompts: list[Prompt], max_new_tokens: object,
                        progress=None) -> str:
        """Tune: mean step time of real runs at each size (best trees from the pool), AR as the engine
        runs it; the curve the size choice and tokens/s predictions use."""
        try:
            ns = sorted({int(x) for x in str(sizes).replace(" ", "").split(",") if x})
            if not ns or any(n < 1 or n > trees.MAX_NODES for n in ns):
                raise ValueError
        except ValueError:
            return f"✗ sizes must be comma-separated node counts in 1..{trees.MAX_NODES}, e.g. 4,8,16,32,64"
        try:
            cfg = self.config("ar", None, "greedy", 0.0, 1.0, None, max_new_tokens, trace=False)
        except UserError as e:
            return f"✗ {e}"
        configs = {0: cfg}
        for n in ns:
            tree = trees.best_tree(session.pool, n, max_depth=self.engine.num_heads, time_limit=5.0) if session.pool \
                else trees.chain(min(n, self.engine.num_heads))
            configs[n] = cfg.replace(mode="medusa", tree=tree)
        walls = {n: [0.0, 0] for n in configs}
        with self.lock:
            for c in configs.values():  # warm-up
                self.engine.generate(prompts[0].text, 8, config=c)
            for i, p in enumerate(prompts):  # round-robin over sizes, prompt by prompt
                if progress is not None:
                    progress((i, len(prompts)), desc=f"prompt {i + 1}/{len(prompts)}")
                for n, c in configs.items():
                    t0 = time.perf_counter()
                    r = self.engine.generate(p.text, config=c)
                    walls[n][0] += time.perf_counter() - t0
                    walls[n][1] += r.steps
        session.latency = {n: {"step_ms": round(1000 * w / s, 3), "ci95": None} for n, (w, s) in walls.items()}
        session.latency_source = f"measured here, {len(prompts)} prompts"
        return "step ms: " + ", ".join(f"{n or 'AR'}: {v['step_ms']:.2f}" for n, v in session.latency.items())

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
        depth = self.engine.num_heads or None
        curve_fig, note = None, ""
        if by_latency:
            if not session.latency:
                return None, "✗ no step times yet: measure or load a latency curve first", None
            rp = trees.Replay(session.pool)
            found: dict[int, list[list[int]]] = {}

            def e_of(k):
                found[k] = trees.best_tree(session.pool, k, str(method), max_depth=depth, **(
                    {"replay": rp, "time_limit": 5.0} if method == "replay" else {}))
                return rp.tokens() / rp.steps({tuple(p) for p in found[k]})

            choice = trees.select_size(e_of, session.latency, n)
            curve_fig = figures.size_curve_figure(choice.curve)
            if choice.nodes == 0:
                return None, (f"AR is fastest on this curve ({choice.tokens_per_s:.0f} tokens/s predicted, "
                              f"{choice.margin:+.1%} over {choice.runner_up} nodes): no tree pays here"), curve_fig
            n = choice.nodes
            note = (f" · size {n} chosen by E(n)/t(n): {choice.tokens_per_s:.0f} tokens/s predicted, "
                    f"{choice.margin:+.1%} over the runner-up ({choice.runner_up} nodes)")
        kw = {"time_limit": 20.0} if method == "replay" else {}
        t = trees.best_tree(session.pool, n, str(method), max_depth=depth, **kw)
        pred = self.predict(session, t)
        return json.dumps(t), f"✓ {len(t)} nodes ({method} optimiser) · {pred.message}{note}", curve_fig

    def confirm_tree(self, session: Session, text: object, prompts: list[Prompt], max_new_tokens: object) -> str:
        """Tune: the prediction against a real greedy run of the tree on the same prompts."""
        try:
            choices = self.parse_tree_text(text)
            cfg = self.config("medusa", choices, "greedy", 0.0, 1.0, None, max_new_tokens, trace=False)
        except UserError as e:
            return f"✗ {e}"
        pred = self.predict(session, choices)
        tokens = steps = 0
        wall = 0.0
        with self.lock:
            for p in prompts:
                t0 = time.perf_counter()
                res = self.engine.generate(p.text, config=cfg)
                wall += time.perf_counter() - t0
                tokens, steps = tokens + res.new_tokens, steps + res.steps
        measured = tokens / steps
        parts = [f"{len(choices)} nodes on {len(prompts)} prompts: measured {measured:.3f} tokens/step, {tokens / wall:.0f} tokens/s"]
        if pred.estimate is not None:
            err = 100 * (pred.estimate.value / measured - 1)
            parts.append(f"predicted {pred.estimate.value:.3f} ({err:+.1f} %; replay on the pool's prompts"
                         + (", exact when they are these prompts" if session.pool_name else "") + ")")
            if pred.tokens_per_s:
                parts.append(f"predicted {pred.tokens_per_s:.0f} tokens/s vs measured {tokens / wall:.0f}")
        else:
            parts.append(pred.message)
        return " · ".join(parts)

    def compare(self, session: Session, a: object, b: object, editor_text: object, prompts: list[Prompt],
                max_new_tokens: object, accept: object, temperature: object, seed: object, progress=None
                ) -> tuple[list[list], str]:
        """Two trees (or AR) on the same prompts, timed alternately: tokens/step, tokens/s, same output."""
        try:
            runs = [None if c == "ar" else self.resolve_choice(c, editor_text) for c in (a, b)]
            cfgs = [self.config("ar" if t is None else "medusa", t, accept, temperature, 1.0, seed, max_new_tokens,
                                trace=False) for t in runs]
        except UserError as e:
            return [], f"✗ {e}"
        rows, same_all = [], True
        totals = [[0, 0, 0.0], [0, 0, 0.0]]
        session.stop.clear()
        with self.lock:
            for i, p in enumerate(prompts):
                if session.stop.is_set():
                    break
                if progress is not None:
                    progress((i, len(prompts)), desc=f"prompt {i + 1}/{len(prompts)}")
                res = []
                for j, c in enumerate(cfgs):
                    t0 = time.perf_counter()
                    r = self.engine.generate(p.text, config=c)
                    totals[j][2] += time.perf_counter() - t0
                    totals[j][0] += r.new_tokens
                    totals[j][1] += r.steps
                    res.append(r)
                same = res[0].token_ids == res[1].token_ids
                same_all &= same
                rows.append([str(p.id), round(res[0].mean_accepted, 3), round(res[1].mean_accepted, 3),
                             round(res[0].tokens_per_s, 1), round(res[1].tokens_per_s, 1), same])
        session.stop.clear()
        if not rows:
            return [], "✗ stopped before any prompt finished"
        tp = [t[0] / t[1] for t in totals]
        speed = [t[0] / t[2] for t in totals]
        greedy = str(accept) == "greedy"
        verdict = ("greedy outputs identical on every prompt ✓" if same_all else "outputs differ ✗") if greedy else \
            "sampled outputs are not expected to match"
        return rows, (f"A {tp[0]:.3f} vs B {tp[1]:.3f} tokens/step; B/A speed {speed[1] / speed[0]:.2f}x "
                      f"over {len(rows)} prompts · {verdict}")

    def compare_rules(self, session: Session, tree_choice: object, editor_text: object, prompts: list[Prompt],
                      temperature: object, samples: object = 32, prefix_tokens: int = 2, max_new_tokens: int = 64
                      ) -> tuple[list[list], str]:
        """The three acceptance rules on the same prompts and tree: mean tokens per step, and the total
        variation distance of each rule's first tokens from the model's own sampling (the row
        "AR vs AR", two independent AR sample sets, is the noise floor a lossless rule sits at)."""
        try:
            tree = self.resolve_choice(tree_choice, editor_text)
            t = float(temperature)
            if not 0 < t <= 2:
                raise UserError(f"temperature must be in (0, 2] to compare sampling rules, got {temperature}")
            n_samples = whole_number(samples, "samples")
            if not 1 <= n_samples <= 256:
                raise UserError("samples must be 1..256")
        except (UserError, TypeError, ValueError) as e:
            return [], f"✗ {e}"
        rules = tuple(RULES)
        tv = {r: [] for r in rules + ("AR vs AR",)}
        per_step = {r: [0, 0] for r in rules}
        with self.lock:
            for p in prompts:
                def draws(mode, accept, seed0):
                    return [tuple(self.engine.generate(p.text, prefix_tokens, mode=mode, tree=tree, accept=accept,
                                                       temperature=t, seed=seed0 + i).token_ids) for i in range(n_samples)]

                ref = draws("ar", "sample", 0)
                tv["AR vs AR"].append(total_variation(ref, draws("ar", "sample", 10_000)))
                for r in rules:
                    tv[r].append(total_variation(ref, draws("medusa", r, 20_000)))
                    res = self.engine.generate(p.text, max_new_tokens, mode="medusa", tree=tree, accept=r, temperature=t,
                                               seed=1)
                    per_step[r][0] += res.new_tokens
                    per_step[r][1] += res.steps
        lossless = {name: rule.lossless for name, rule in RULES.items()} | {"AR vs AR": "(noise floor)"}
        rows = [[r, lossless[r], round(per_step[r][0] / per_step[r][1], 3) if r in per_step else None,
                 round(sum(tv[r]) / len(tv[r]), 3)] for r in tv]
        return rows, (f"{len(prompts)} prompts, {n_samples} samples each, first {prefix_tokens} tokens, T = {t}; "
                      "greedy ignores the temperature (it is exact for T = 0)")

    # -- API -------------------------------------------------------------------------------------------
    def api_generate(self, session: Session, prompt: object, tree: object = trees.DEFAULT_TREE, mode: object = "medusa",
                     accept: object = "greedy", temperature: object = 0.7, top_p: object = 1.0, seed: object = None,
                     max_new_tokens: object = 64) -> dict:
        """Whole generation as JSON (the /generate endpoint)."""
        tree = tree if isinstance(tree, str) and tree.strip() else trees.DEFAULT_TREE
        choice, text = (EDITOR, tree) if tree.strip().startswith(("[", "{")) else (tree, "")
        last = None
        for ev in self.decode(session, prompt, choice, text, mode, accept, temperature, top_p, seed, max_new_tokens):
            if "error" in ev:
                return {"error": ev["error"]}
            last = ev
        run = session.run
        tokens = run.stream
        return {"text": "".join(run.pieces), "token_ids": tokens, "steps": len(run.traces),
                "mean_accepted": round(len(tokens) / max(len(run.traces), 1), 4), "finish_reason": run.finish,
                "stats": last["stats"] if last else "", "run_id": run.run_id}


def total_variation(a: list, b: list) -> float:
    """TV distance between two empirical distributions (lists of outcomes)."""
    from collections import Counter

    ca, cb = Counter(a), Counter(b)
    return 0.5 * sum(abs(ca[k] / len(a) - cb[k] / len(b)) for k in set(ca) | set(cb))


def example_prompt() -> str:
    """The README's CLI prompt, so the app and `python -m engine generate` start in the same place."""
    return "def read_config(path):"


def default_data_dir() -> Path:
    return Path.home() / ".medusa-workbench"
