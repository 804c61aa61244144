"""Per-browser-session state and the jobs that run in it: what every tab shares.

A session is found by Gradio's session hash and holds its own Stop flag, its last decode run, its
trace pool and its latency curve, so one user's Stop or traces never touch another's. Every job (a
decode, a trace collection, a timing, a comparison) runs inside `Sessions.job`: a session with a job
running is never forgotten, its Stop is checked between decoding steps, and a session whose client
went away during a job is stopped at once and forgotten when the job ends. Idle sessions beyond MAX_SESSIONS are
forgotten, least recently used first, and only the newest MAX_RUNS_IN_MEMORY keep their run's traces
in memory (every run is on disk), so memory stays bounded whatever the number of users.

Input checks every tab uses live here too: a user's bad value is a `UserError` with a one-line
message, never an exception in the UI.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import trees

MAX_SESSIONS = 64  # idle sessions whose state is kept
MAX_RUNS_IN_MEMORY = 8  # sessions whose last run's traces stay in memory


class UserError(ValueError):
    """Shown to the user as a message."""


class Stopped(Exception):
    """The session's Stop (or its client leaving) ended a job between two decoding steps."""


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


def step_index(v: object, steps: int) -> int | None:
    """A step number from the slider, a click or the timer, clamped into [0, steps); None when there
    is no step to show or `v` is not a finite number (NaN, inf and "abc" arrive from crafted events)."""
    if steps < 1 or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return max(0, min(int(v), steps - 1))


STEP_KEYS = ("step", "tree", "accepted_nodes", "accepted_tokens", "accepted_text")  # every step record has them
PER_NODE_KEYS = ("parent", "node_tokens", "node_text", "target_argmax", "target_argmax_text", "target_argmax_prob")


def step_problem(step: object) -> str | None:
    """What a saved step record (docs/trace-schema.md) lacks for the Decode tab to draw it, or None: checked
    when a run is loaded, so a damaged file is named there and not met later as a failed drawing."""
    if not isinstance(step, dict):
        return "a step is not a JSON object"
    missing = [k for k in STEP_KEYS if k not in step]
    if missing:
        return f"step {step.get('step', '?')} lacks '{missing[0]}'"
    if not isinstance(step["tree"], list):
        return f"step {step['step']}: 'tree' is not a list of paths"
    nodes = 1 + len(step["tree"])
    for key in PER_NODE_KEYS:
        if key in step and not (isinstance(step[key], list) and len(step[key]) == nodes):
            return f"step {step['step']}: '{key}' is not a list of its {nodes} nodes"
    accepted = step["accepted_nodes"]
    if not (isinstance(accepted, list) and accepted and all(isinstance(i, int) and 0 <= i < nodes for i in accepted)):
        return f"step {step['step']}: 'accepted_nodes' names nodes outside its tree"
    return None


@dataclass
class RunState:
    """One decode run as the session sees it; every update is O(step)."""

    settings: dict
    traces: list[dict] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)  # text each step added
    ends: list[int] = field(default_factory=list)  # per step: where its text ends in the run's text (characters)
    hits_at: list[tuple[tuple[int, int], ...]] = field(default_factory=list)  # per step: head_hits as they stood then
    stream: list[int] = field(default_factory=list)
    head_hits: list[list[int]] = field(default_factory=list)  # per head: [top-1 right, resolved]
    pending: list[list] = field(default_factory=list)  # [stream index of root, heads' top-1, heads resolved]
    finish: str | None = None
    wall_s: float = 0.0
    run_id: str | None = None
    save_error: str | None = None

    def add(self, trace: dict, text: str) -> None:
        start = len(self.stream)
        self.traces.append(trace)
        self.pieces.append(text)
        self.ends.append((self.ends[-1] if self.ends else 0) + len(text))
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
        self.hits_at.append(tuple((h[0], h[1]) for h in self.head_hits))

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def step_at(self, offset: object) -> int | None:
        """The step whose text holds character `offset` of the run's text (a click in the page sends the
        offset, not the step: the page keeps one text node, not a span per step); None when there is
        no step or `offset` is not a number."""
        i = step_index(offset, self.ends[-1] + 1 if self.ends else 0)
        if i is None or not self.ends:
            return None
        return min(bisect.bisect_right(self.ends, i), len(self.ends) - 1)

    def head_hits_until(self, step: int) -> list[tuple[int, int]]:
        """Per head (top-1 right, resolved) as known when `step` had been decoded: what the head panel
        says 'so far' at that step."""
        return list(self.hits_at[step]) if 0 <= step < len(self.hits_at) else []

    @property
    def tokens(self) -> int:
        return len(self.stream)

    def stats(self) -> str:
        n = len(self.traces)
        if not n:
            return "no steps yet"
        rate = f", {self.tokens / self.wall_s:.1f} tokens/s" if self.wall_s > 0 else ""
        end = {"eos": "stopped: end of text", "length": "stopped: length", "user": "stopped by user"}.get(self.finish or "", "")
        saved = f" · not saved: {self.save_error}" if self.save_error else ""
        return f"{self.tokens} tokens, {n} steps, {self.tokens / n:.2f} tokens/step{rate}" + (f" · {end}" if end else "") + saved


@dataclass
class Session:
    id: str
    stop: threading.Event = field(default_factory=threading.Event)
    run: RunState | None = None
    pool: list[trees.Run] = field(default_factory=list)  # AR traces: the estimators' input
    pool_name: str = ""
    latency: dict[int, dict] | None = None  # measured step times by tree size (trees.latency_points)
    latency_source: str = ""
    model: str | None = None  # the model this session decodes with (None: the one the app started with)
    chat: bool | None = None  # wrap prompts in the chat template (None: when the model has one)
    jobs: int = 0  # jobs running now: while > 0 the session is never forgotten
    waiting: bool = False  # a job's button was clicked and its job has not started (nor failed before starting)
    playing: bool = False  # the Decode tab's playback is on (its timer's ticks advance the step)
    tree_view: tuple[float, bool] | None = None  # Decode's prune and show-every-node as the user last set them
    tree_drawn: tuple | None = None  # Decode: (run, step, view) of the step tree the page was last sent
    closed: bool = False  # its client went away

    def check_stop(self) -> None:
        """Called between decoding steps: raise Stopped once Stop was pressed or the client left."""
        if self.stop.is_set():
            raise Stopped


class Sessions:
    """The session table (see the module docstring)."""

    def __init__(self, default_pool: Callable[[], tuple[list[trees.Run], str]]):
        self._items: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()
        self._default_pool = default_pool

    def get(self, sid: str | None) -> Session:
        """The session of this hash, made on first use; the most recently used."""
        sid = sid or "default"
        with self._lock:
            s = self._items.get(sid)
            if s is None:
                pool, name = self._default_pool()
                s = self._items[sid] = Session(sid, pool=list(pool), pool_name=name)
            self._items.move_to_end(sid)
            self._shrink()
            return s

    @contextmanager
    def job(self, session: Session) -> Iterator[Session]:
        """Run a job in this session: kept in the table (put back if it was forgotten meanwhile) until
        the job ends; then its Stop is cleared, and a session whose client left is forgotten."""
        with self._lock:
            self._items[session.id] = session
            self._items.move_to_end(session.id)
            session.jobs += 1
            session.waiting = False  # its click has become this running job
        try:
            yield session
        finally:
            with self._lock:
                session.jobs -= 1
                if self._items.get(session.id) is session:
                    self._items.move_to_end(session.id)  # a job that just ended is the newest use
                    if session.closed and not session.jobs:
                        del self._items[session.id]
                if not session.jobs:
                    session.stop.clear()
                self._shrink()

    def begin(self, sid: str | None) -> bool:
        """A job's button was pressed: a Stop pressed before it belongs to an earlier job. False (and
        nothing changed) while this session's previous job is queued or running: the page says so."""
        s = self.get(sid)
        with self._lock:
            if s.waiting or s.jobs:
                return False
            s.waiting = True
        s.stop.clear()
        return True

    def end(self, sid: str | None) -> None:
        """The event of the last accepted click has ended: the next click is a new job, also when the
        event failed (bad input) before its job started."""
        self.get(sid).waiting = False

    def stop(self, sid: str | None) -> str:
        """The Stop button: the session's job ends after its step in flight, or as it leaves the queue
        (nothing to stop in a session the table does not hold: a session with a job is always held).
        -> what was stopped: "running", "queued" (its job had not started) or "idle"."""
        with self._lock:
            s = self._items.get(sid or "default")
        if s is None:
            return "idle"
        s.stop.set()
        return "running" if s.jobs else "queued" if s.waiting else "idle"

    def close(self, sid: str) -> None:
        """Its client went away during a job: stop the job now and forget the session when it ends.
        An idle session is left alone (a stream that closes as its last event completes is not a
        client leaving; idle sessions are forgotten in their turn)."""
        with self._lock:
            s = self._items.get(sid)
            if s is None or not s.jobs:
                return
            s.closed = True
            s.stop.set()

    def _shrink(self) -> None:
        """Forget idle sessions beyond MAX_SESSIONS and old runs beyond MAX_RUNS_IN_MEMORY (lock held)."""
        idle = [sid for sid, s in self._items.items() if not s.jobs]
        for sid in idle[: max(0, len(self._items) - MAX_SESSIONS)]:
            del self._items[sid]
        for s in list(self._items.values())[:-MAX_RUNS_IN_MEMORY]:
            if not s.jobs:
                s.run = None  # its traces are on disk (runs/)

    def running(self) -> list[Session]:
        """The sessions with a job now."""
        with self._lock:
            return [s for s in self._items.values() if s.jobs]

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, sid: str) -> bool:
        return sid in self._items
