"""One generation run: prefill -> step runner -> stop criteria -> incremental detokeniser -> trace.

`Session.run` is the loop the engine's generate/stream share; each part it calls has one job:
  runner     EagerRunner (any device, any acceptance) or GraphRunner (CUDA graphs, greedy), one
             `launch(state)` / `collect(handle, state)` interface returning one StepEvent per
             request; a GraphRunner may queue step N+1 (graphs.STEPS_AHEAD steps) before the host
             reads step N, so host work overlaps the GPU's
  Request    one prompt's output: cuts at EOS and the token limit, text through the detokeniser
  trace      traced runs give each StepEvent the run's TraceContext and write its line
             (engine/trace.py: the record and its JSON are one thing); a traced AR run's heads'
             top-k is filled for a batch of steps at once (engine/head_trace.py), so on CUDA
             graphs its steps reach the stream and the file 16 to 32 steps late
  StepClock  each step's wall time (`step_ms`), its forward included on every runner
The first token is sampled only under a rule that samples (`sample`); greedy and typical start
from the argmax. Requests that finish leave the batch once no step is in flight (docs/algorithm.md).
"""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Iterator

import torch

from trees import TreeBuffers

from .accept import Rule
from .decode import DecodeState, ar_forward, finish_step, prefill, tree_forward
from .detok import IncrementalDetokenizer
from .generation import GenerationConfig
from .graphs import STEPS_AHEAD, StepGraphs
from .head_trace import HeadTrace, HiddenRing
from .heads import MedusaHeads
from .model import Transformer
from .sampling import SamplingParams
from .trace import StepEvent, TraceContext, TraceWriter


def root_params(rule: Rule, params: SamplingParams) -> SamplingParams:
    """How roots the step does not verify are chosen (the first token, and every AR token): drawn
    from the target under a rule that samples, else the argmax (Medusa's typical acceptance too)."""
    return params if rule.samples else SamplingParams()


class Request:
    """One prompt's output so far: cut at EOS and at the token limit, detokenised incrementally."""

    def __init__(self, index: int, prompt: list[int], tokenizer, max_new: int, eos_ids: set[int], stop_on_eos: bool,
                 text: bool = True):
        self.index, self.prompt, self.max_new = index, prompt, max_new
        self.eos_ids = eos_ids if stop_on_eos else set()
        self.tokens: list[int] = []
        self.detok = IncrementalDetokenizer(tokenizer) if text else None
        self.finish: str | None = None

    def commit(self, tokens: list[int]) -> tuple[list[int], str]:
        """Keep a step's tokens up to the limit and the first EOS; -> (kept tokens, text they add)."""
        tokens = tokens[: self.max_new - len(self.tokens)]
        for i, t in enumerate(tokens):
            if t in self.eos_ids:
                tokens, self.finish = tokens[: i + 1], "eos"
                break
        self.tokens.extend(tokens)
        if self.finish is None and len(self.tokens) >= self.max_new:
            self.finish = "length"
        if self.detok is None:
            return tokens, ""
        text = self.detok.push(tokens)
        return tokens, text + self.detok.flush() if self.finish else text


class EagerRunner:
    """Steps launched op by op: any device, any acceptance rule. Never runs ahead."""

    ahead = 0  # steps it may have launched beyond the one the session reads next

    def __init__(self, model: Transformer, heads: MedusaHeads | None, buf: TreeBuffers | None, rule: Rule,
                 params: SamplingParams, gen: torch.Generator | None, trace_topk: int):
        self.model, self.heads, self.buf, self.rule = model, heads, buf, rule
        self.params, self.gen, self.trace_topk = params, gen, trace_topk

    @torch.inference_mode()
    def launch(self, state: DecodeState, ahead: int = 0):
        if self.buf is not None:
            return tree_forward(self.model, self.heads, self.buf, state, self.rule, self.params, self.gen,
                                trace=bool(self.trace_topk))
        return ar_forward(self.model, state, root_params(self.rule, self.params), self.gen, trace_topk=self.trace_topk)

    def collect(self, handle, state: DecodeState) -> list[StepEvent]:
        return finish_step(state, handle)


class GraphRunner:
    """Greedy steps replayed from CUDA graphs (engine/graphs.py); may queue `STEPS_AHEAD` steps ahead."""

    ahead = STEPS_AHEAD

    def __init__(self, graphs: StepGraphs, heads: MedusaHeads | None, buf: TreeBuffers | None, choices, trace_topk: int):
        self.graphs, self.heads, self.buf, self.trace_topk = graphs, heads, buf, trace_topk
        self.ring: HiddenRing | None = None  # a traced AR run's: its steps write their hidden states into it
        self.tree_key = StepGraphs.tree_key(choices if buf is not None else None)

    def launch(self, state: DecodeState, ahead: int = 0):
        return self.graphs.launch(self.heads, self.buf, self.tree_key, state, self.trace_topk, ahead, self.ring)

    def collect(self, handle, state: DecodeState) -> list[StepEvent]:
        return self.graphs.collect(handle, state)


class StepClock:
    """Each step's wall time, forward included: from the moment the step could start to the moment
    its result was read. A step launched after the previous one was read (the eager runner) starts at
    its launch, so its forward counts; a step queued before the previous read (the graph runner, which
    queues ahead) starts when that read ended, so the two never share time. Time the caller of the
    stream spends between steps is the caller's, not a step's. Summed over a run, the steps' times
    are the run's wall time less prefill and the caller's time.

    Timeline of a queued step N+1:  launch N+1 | read N ... [caller] ... read N+1
    its time: read N -> read N+1, less [caller]."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.last_read: float | None = None
        self.paused = 0.0  # caller's time since the last read

    def now(self) -> float:
        return self.clock()

    def read(self, launched: float) -> float:
        """Milliseconds of the step launched at `launched` whose result was just read."""
        now = self.clock()
        if self.last_read is not None and launched < self.last_read:  # queued before the previous read
            start, caller = self.last_read, self.paused
        else:  # launched after it: the caller's time lies before the launch
            start, caller = launched, 0.0
        self.last_read, self.paused = now, 0.0
        return (now - start - caller) * 1000

    def caller_took(self, seconds: float) -> None:
        self.paused += seconds

    def extend(self) -> float:
        """Milliseconds since the last read (less the caller's time), from now on counted in the step
        just read: host work that follows a read and belongs to that step (a traced AR run's heads pass)."""
        now = self.clock()
        ms = (now - self.last_read - self.paused) * 1000
        self.last_read, self.paused = now, 0.0
        return ms


class Session:
    """Decode a batch of prompts under one GenerationConfig. Built (and checked) by Engine.session."""

    def __init__(self, model: Transformer, heads: MedusaHeads | None, requests: list[Request], cfg: GenerationConfig,
                 buf: TreeBuffers | None, choices: list[list[int]] | None, runner, trace: TraceContext | None,
                 writer: TraceWriter | None, gen: torch.Generator | None, head_trace: HeadTrace | None = None):
        self.model, self.requests, self.cfg, self.buf, self.choices = model, requests, cfg, buf, choices
        self.runner, self.trace, self.writer, self.gen = runner, trace, writer, gen
        self.prefill_heads = heads
        self.head_trace = head_trace  # a traced AR run's heads' top-k, filled in batches of steps
        self.filled: collections.deque[list[StepEvent]] = collections.deque()  # steps filled, not yet handed out
        self.per_step = buf.depth + 1 if buf is not None else 1  # most tokens one step can commit
        self.clock = StepClock()

    def run(self) -> Iterator[list[StepEvent]]:
        """Yield, per step, the event of every request still running (a traced AR run's steps later,
        one per step read, as their heads' top-k is filled: `_ready`)."""
        params = root_params(self.cfg.rule(), self.cfg.sampling())
        state = prefill(self.model, self.prefill_heads, [r.prompt for r in self.requests], params, self.gen)
        if state.root.device.type == "cuda":  # prefill's kernels end here, so the first step's time is its own
            torch.cuda.synchronize(state.root.device)
        rows = list(range(len(self.requests)))  # the request of each batch row
        clock = self.clock
        if self.head_trace is not None:
            self.head_trace.save(-1, state.hidden, rows)
        launches = itertools.count()
        inflight = collections.deque([self._launch(state, rows, next(launches))])  # launched, not yet read
        try:
            for step in itertools.count():
                handle, rows, launched = inflight.popleft()
                # queue steps N+1 .. N+ahead before reading step N, unless a step not yet read may end a request
                while len(inflight) < self.runner.ahead and not self._may_end(rows, 1 + len(inflight)):
                    inflight.append(self._launch(state, rows, next(launches), self.per_step * (1 + len(inflight))))
                prefix = list(state.host_lengths)
                results = self.runner.collect(handle, state)
                ms = clock.read(launched)
                # a request that ended at step N is still in the batch of the steps queued before that was
                # known: its rows of those steps are dropped here
                events = [self._event(step, self.requests[req], ev, prefix[row], ms)
                          for row, (req, ev) in enumerate(zip(rows, results)) if self.requests[req].finish is None]
                live = [i for i, req in enumerate(rows) if self.requests[req].finish is None]
                for ready in self._ready(step, events, last=not live):
                    handed = clock.now()
                    yield ready
                    clock.caller_took(clock.now() - handed)
                if not live:
                    return
                if not inflight:
                    if len(live) < len(rows):  # finished requests leave the batch (nothing is in flight)
                        state.keep(live)
                        self.model.cache.keep_rows(torch.tensor(live, device=state.root.device))
                        rows = [rows[i] for i in live]
                    inflight.append(self._launch(state, rows, next(launches)))
        finally:
            if inflight and hasattr(inflight[-1][0], "done"):  # steps queued past the end
                inflight[-1][0].done.synchronize()

    def _launch(self, state: DecodeState, rows: list[int], step: int, ahead: int = 0) -> tuple:
        """Launch step `step` (the eager runner runs it here, forward included; `ahead`: tokens the steps
        launched before it and not yet read may still add) -> (handle, rows, launch time)."""
        launched = self.clock.now()
        handle = self.runner.launch(state, ahead)
        if self.head_trace is not None:  # queued right behind the step, before a later step reuses its buffers
            self.head_trace.save(step, handle.hidden, rows)
        return handle, rows, launched

    def _ready(self, step: int, events: list[StepEvent], last: bool) -> list[list[StepEvent]]:
        """The steps' events to hand out now, in order, each written to the trace file as it goes:
        this step's; or, when the heads' top-k is filled in batches of steps (`head_trace`), the
        oldest step filled, one per step read (so the host's work per step stays spread over the
        steps), and at the end every one."""
        if self.head_trace is None:
            ready = [events] if events else []
        else:
            self.filled.extend(self.head_trace.hold(step, events))
            if last:
                self.filled.extend(self.head_trace.finish())
            spent = self.clock.extend()  # the heads pass, when one ran, is this step's work
            for ev in events:
                ev.step_ms += spent
            ready = [self.filled.popleft() for _ in range(len(self.filled) if last else min(1, len(self.filled)))]
        if self.writer is not None:
            for ev in (ev for evs in ready for ev in evs):
                self.writer.write(ev.trace)
        return ready

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    def _may_end(self, rows: list[int], unread: int) -> bool:
        """Could the `unread` steps launched and not yet read end a request (so the batch may change)?
        By the token limit, or a request has already ended."""
        return any(r.finish is not None or r.max_new - len(r.tokens) <= self.per_step * unread
                   for r in (self.requests[i] for i in rows))

    def _event(self, step: int, req: Request, ev: StepEvent, prefix_len: int, ms: float) -> StepEvent:
        """The runner's record of a request's step, completed: cut, with its text, timed, traced."""
        ev.tokens, ev.text = req.commit(ev.tokens)
        ev.step, ev.prefix_len, ev.step_ms, ev.request = step, prefix_len, ms, req.index
        ev.done, ev.finish_reason = req.finish is not None, req.finish
        ev.context = self.trace
        return ev

