"""What every tab shares: the one Engine, the store, the sessions, and the tree, prompt, settings
and prediction logic (plain functions over them, testable without a browser).

Every user error comes back as a `UserError` (a message), never an exception in the UI; only a real
bug is called an internal error (and logged). The Engine serialises its own runs (engine.Engine), and
the app runs every engine job in one Gradio concurrency group, so jobs take turns.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trees
from engine import Engine, GenerationConfig, GenerationError
from engine.engine import device_free_memory
from engine.prompts import Prompt, PromptFileError, heldout_prompts, parse_prompts, read_prompts

from .memory import on_one_thread
from .models import DeviceMemory, Engines, model_choices
from .prompt_sets import named_prompt_set
from .session import Session, Sessions, UserError, finite_number, user_message, whole_number
from .store import Store, StoreError

log = logging.getLogger("workbench")
EDITOR = "(tree editor)"  # the tree choice that means "the tree in the editor"
MODEL_TREE = "(model default)"  # the tree choice that means "the selected model's own default tree"
MAX_PROMPT_CHARS = 20_000
MAX_JOB_PROMPTS = 256
PROMPT_SOURCES = ["held-out", "mt-bench", "sharegpt", "pasted", "file"]  # the prompt-set radios of Tune and Compare


@dataclass
class Prediction:
    estimate: trees.Estimate | None
    tokens_per_s: float | None
    step_ms: float | None
    size_used: int | None
    message: str


@dataclass
class Decoded:
    """One prompt decoded by a job (`Workbench.generate`)."""

    token_ids: list[int]
    steps: int
    wall_s: float
    traces: list[dict] = field(default_factory=list)
    cut: bool = False  # ended at the caller's deadline, before the run's own end

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def mean_accepted(self) -> float:
        return self.new_tokens / max(self.steps, 1)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0


class Workbench:
    """The app's state: the engines (one per model, the started one first), the store and the sessions.
    Each session decodes with the model it selected (`Session.model`; None: the started one)."""

    def __init__(self, engine: Engine, data_dir: Path, default_traces: Path | None = None,
                 loader: Callable[[str], Engine] | None = None, model: str | None = None, max_engines: int = 2):
        self.model = model or engine.name  # the model the app was started with
        # the device's free memory, not the engine's method: the cache must be able to let the started engine go
        free = functools.partial(device_free_memory, engine.device)
        memory = DeviceMemory(free, engine.model.embed_tokens.weight.element_size()) if loader else None
        self.engines = Engines(loader or _no_loader, max_engines, memory)
        self.engines.add(self.model, engine)
        self.store = Store(data_dir)
        self.default_pool: tuple[list[trees.Run], str] = ([], "")
        if default_traces is not None:  # read now: a bad file stops the app at start with one line
            self.default_pool = (trees.ar_runs(trees.read_runs(default_traces)), Path(default_traces).name)
        self.sessions = Sessions(lambda: self.default_pool)

    @property
    def data_dir(self) -> Path:
        return self.store.root

    @property
    def engine(self) -> Engine:
        """The engine of the model the app was started with (page layout, sessions that chose none)."""
        return self.engines.get(self.model)

    def model_of(self, session: Session | None) -> str:
        return (session.model if session is not None else None) or self.model

    def engine_of(self, session: Session | None) -> Engine:
        """The engine of the session's model, loaded on first use (UserError when it cannot be)."""
        return self.engines.get(self.model_of(session))

    def choose_model(self, session: Session, name: object) -> Engine:
        """Switch `session` to the model `name`, loaded now: what the page's model selector and the API's
        `model` argument do. A name the app does not offer (its selector's choices) or a model that cannot
        load is a one-line UserError, and the session stays on its model."""
        offered = model_choices(self.model)
        name = str(name or "").strip()
        if name not in offered:
            raise UserError(f"unknown model {name!r}: this app offers {', '.join(offered)}")
        engine = self.engines.get(name)
        session.model, session.chat = name, None
        return engine

    @contextmanager
    def job(self, session: Session) -> Iterator[Engine]:
        """A job of `session` (Sessions.job) holding its model's engine, which is not evicted meanwhile."""
        with self.sessions.job(session), self.engines.using(self.model_of(session)) as engine:
            yield engine

    # -- trees -------------------------------------------------------------------------------------
    def tree_names(self) -> list[str]:
        return [EDITOR, MODEL_TREE] + trees.names() + [f"saved/{n}" for n in self.store.tree_names()]

    def parse_tree_text(self, text: object, session: Session | None = None) -> list[list[int]]:
        """Tree JSON typed or pasted by a user (never a file path or a Python literal), checked by the
        one validator against the session's engine's topk and head count."""
        eng = self.engine_of(session)
        if not isinstance(text, str) or not text.strip():
            raise UserError("the tree is empty: write a list of paths, e.g. [[0], [0, 0], [1]]")
        try:
            obj = trees.parse_json(text, "tree")
            if not isinstance(obj, (list, dict)):
                raise trees.TreeError("a tree must be a JSON list of paths (or a schema-1 object)")
            return trees.resolve(obj, topk=eng.topk, num_heads=eng.num_heads or None)
        except (trees.TreeError, trees.JsonInputError) as e:
            raise UserError(user_message(e)) from None

    def resolve_choice(self, choice: object, editor_text: object, session: Session | None = None) -> list[list[int]]:
        if choice == EDITOR:
            return self.parse_tree_text(editor_text, session)
        if not isinstance(choice, str) or not choice:
            raise UserError("choose a tree")
        eng = self.engine_of(session)
        try:
            if choice == MODEL_TREE:
                if not eng.num_heads:
                    raise UserError(f"{eng.name} has no Medusa heads (none: AR), so it has no default tree: "
                                    "decode in mode ar, or choose a tree to validate")
                found = eng.resolve_tree(eng.default_tree)
            elif choice.startswith("saved/"):
                found = self.store.load_tree(choice[len("saved/"):]).medusa_choices
            else:
                found = trees.preset(choice)
            return trees.resolve(found, topk=eng.topk, num_heads=eng.num_heads or None)
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

    # -- settings and prompts ----------------------------------------------------------------------
    def check_prompt(self, prompt: object) -> str:
        if not isinstance(prompt, str) or not prompt.strip():
            raise UserError("the prompt is empty")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise UserError(f"the prompt has {len(prompt)} characters; the limit is {MAX_PROMPT_CHARS}")
        return prompt

    def config(self, mode: object, tree: list[list[int]] | None, accept: object, temperature: object, top_p: object,
               seed: object, max_new_tokens: object, trace: bool = True, session: Session | None = None
               ) -> GenerationConfig:
        """A checked GenerationConfig from UI values (numbers may arrive as floats); the chat template
        as the session chose (None: the engine's default, on when the tokenizer has one)."""
        seed = None if seed is None or seed == "" else whole_number(seed, "seed")
        cfg = GenerationConfig(max_new_tokens=whole_number(max_new_tokens, "max new tokens"), mode=str(mode), tree=tree,
                               accept=str(accept), temperature=finite_number(temperature, "temperature"),
                               top_p=finite_number(top_p, "top_p"), seed=seed, trace=trace,
                               chat=session.chat if session is not None else None)
        try:
            return cfg.validate()
        except GenerationError as e:
            raise UserError(str(e)) from None

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
            elif source in ("mt-bench", "sharegpt"):
                found = named_prompt_set(str(source))
            else:
                found = [Prompt(t, [t], i) for i, t in enumerate(heldout_prompts(n))]
        except PromptFileError as e:
            raise UserError(user_message(e)) from None
        for p in found:
            if len(p.text) > MAX_PROMPT_CHARS:
                raise UserError(f"prompt {p.id!r} has {len(p.text)} characters; the limit is {MAX_PROMPT_CHARS}")
        return found[:n]

    # -- decoding in jobs --------------------------------------------------------------------------
    def generate(self, session: Session, prompt: str, cfg: GenerationConfig, deadline: float | None = None) -> Decoded:
        """One prompt decoded for a job of `session`, its Stop checked between steps (raises Stopped).
        A prompt the engine refuses (too long for the context, ...) is a UserError naming it. With a
        deadline (time.monotonic()), the run ends after the first step that finishes past it (`cut`),
        so a budgeted job overruns by one step, not by a whole run."""
        t0 = time.perf_counter()
        cut = False
        try:
            events = self.engine_of(session).stream(prompt, config=cfg)
        except GenerationError as e:
            raise UserError(user_message(e)) from None
        tokens, traces, steps = [], [], 0
        try:
            for ev in on_one_thread(events):  # MKL's buffers once, not per Gradio worker (memory.py)
                tokens += ev.tokens
                steps += 1
                if ev.trace is not None:
                    traces.append(ev.trace)
                session.check_stop()
                if deadline is not None and not ev.done and time.monotonic() > deadline:
                    cut = True
                    break
        finally:
            events.close()
        return Decoded(tokens, steps, time.perf_counter() - t0, traces, cut)


def each_prompt(session: Session, prompts: list[Prompt], progress=None) -> Iterator[Prompt]:
    """A job's prompts one at a time: the session's Stop checked before each (Stopped), progress shown."""
    for i, p in enumerate(prompts):
        session.check_stop()
        if progress is not None:
            progress((i, len(prompts)), desc=f"prompt {i + 1}/{len(prompts)}")
        yield p


def _no_loader(name: str) -> Engine:
    """Workbenches built around one engine (tests, scripts) load no other model."""
    raise UserError(f"cannot load {name!r}: this workbench was built around one engine and loads no other")


def default_data_dir() -> Path:
    return Path.home() / ".medusa-workbench"
