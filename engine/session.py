"""One generation run: prefill -> step runner -> stop criteria -> incremental detokeniser -> tracer.

`Session.run` is the loop the engine's generate/stream share; each part it calls has one job:
  runner     EagerRunner (any device, any acceptance) or GraphRunner (CUDA graphs, greedy), one
             `launch(state)` / `collect(handle, state)` interface; a GraphRunner may queue step N+1
             before the host reads step N, so host work overlaps the GPU's
  Request    one prompt's output: cuts at EOS and the token limit, text through the detokeniser
  Tracer     the step trace (engine/trace.py), built from fields the step packed on the device
Requests that finish leave the batch once no step is in flight (docs/algorithm.md).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from trees import TreeBuffers

from .decode import DecodeState, StepResult, ar_forward, finish_step, prefill, tree_forward
from .detok import IncrementalDetokenizer
from .generation import GenerationConfig
from .graphs import StepGraphs
from .heads import MedusaHeads
from .model import Transformer
from .sampling import SamplingParams
from .trace import Tracer


@dataclass
class StepEvent:
    """One request's decoding step, as the API streams it."""

    step: int
    tokens: list[int]  # committed this step (cut at EOS / the token limit)
    text: str  # exactly the text this step added: joined over a run, the run's text
    accepted_nodes: list[int]  # tree nodes kept, root (0) first
    step_ms: float
    trace: dict | None = None  # the step trace (docs/trace-schema.md) when the run is traced
    done: bool = False
    finish_reason: str | None = None  # "eos" | "length" on the last event
    request: int = 0  # index of the prompt in a batch


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

    ahead = False

    def __init__(self, model: Transformer, heads: MedusaHeads | None, buf: TreeBuffers | None, accept: str,
                 params: SamplingParams, gen: torch.Generator | None, trace_topk: int):
        self.model, self.heads, self.buf, self.accept = model, heads, buf, accept
        self.params, self.gen, self.trace_topk = params, gen, trace_topk

    @torch.inference_mode()
    def launch(self, state: DecodeState, ahead: int = 0):
        if self.buf is not None:
            return tree_forward(self.model, self.heads, self.buf, state, self.accept, self.params, self.gen,
                                trace=bool(self.trace_topk))
        return ar_forward(self.model, self.heads, state, self.params, self.gen, trace_topk=self.trace_topk)

    def collect(self, handle, state: DecodeState) -> list[StepResult]:
        return finish_step(state, handle)


class GraphRunner:
    """Greedy steps replayed from CUDA graphs (engine/graphs.py); may queue one step ahead."""

    ahead = True

    def __init__(self, graphs: StepGraphs, heads: MedusaHeads | None, buf: TreeBuffers | None, choices, trace_topk: int):
        self.graphs, self.heads, self.buf, self.choices, self.trace_topk = graphs, heads, buf, choices, trace_topk

    def launch(self, state: DecodeState, ahead: int = 0):
        return self.graphs.launch(self.heads, self.buf, self.choices, state, self.trace_topk, ahead)

    def collect(self, handle, state: DecodeState) -> list[StepResult]:
        return self.graphs.collect(handle, state)


class Session:
    """Decode a batch of prompts under one GenerationConfig. Built (and checked) by Engine.session."""

    def __init__(self, model: Transformer, heads: MedusaHeads | None, requests: list[Request], cfg: GenerationConfig,
                 buf: TreeBuffers | None, choices: list[list[int]] | None, runner, tracer: Tracer | None,
                 gen: torch.Generator | None):
        self.model, self.requests, self.cfg, self.buf, self.choices = model, requests, cfg, buf, choices
        self.runner, self.tracer, self.gen = runner, tracer, gen
        self.prefill_heads = heads
        self.per_step = buf.depth + 1 if buf is not None else 1  # most tokens one step can commit

    def run(self) -> Iterator[list[StepEvent]]:
        """Yield, per step, the event of every request still running."""
        state = prefill(self.model, self.prefill_heads, [r.prompt for r in self.requests], self.cfg.sampling(), self.gen)
        rows = list(range(len(self.requests)))  # the request of each batch row
        inflight = (self.runner.launch(state), rows)
        try:
            for step in itertools.count():
                t0 = time.perf_counter()
                handle, rows = inflight
                inflight = None
                if self.runner.ahead and not self._may_end(rows):  # queue step N+1 before reading step N
                    inflight = (self.runner.launch(state, self.per_step), rows)
                prefix = list(state.host_lengths)
                results = self.runner.collect(handle, state)
                ms = (time.perf_counter() - t0) * 1000
                # a request that ended at step N is still in the batch of a step N+1 queued before that
                # was known: its row of that step is dropped here
                events = [self._event(step, self.requests[req], res, prefix[row], ms)
                          for row, (req, res) in enumerate(zip(rows, results)) if self.requests[req].finish is None]
                if events:
                    yield events
                live = [i for i, req in enumerate(rows) if self.requests[req].finish is None]
                if not live:
                    return
                if inflight is None:
                    if len(live) < len(rows):  # finished requests leave the batch (nothing is in flight)
                        state.keep(live)
                        self.model.cache.keep_rows(torch.tensor(live, device=state.root.device))
                        rows = [rows[i] for i in live]
                    inflight = (self.runner.launch(state), rows)
        finally:
            if inflight is not None and hasattr(inflight[0], "done"):  # a step queued past the end
                inflight[0].done.synchronize()

    def close(self) -> None:
        if self.tracer is not None and self.tracer.writer is not None:
            self.tracer.writer.close()

    def _may_end(self, rows: list[int]) -> bool:
        """Could the step in flight end a request (so the batch may change)? By the token limit, or
        a request has already ended."""
        return any(r.finish is not None or r.max_new - len(r.tokens) <= self.per_step
                   for r in (self.requests[i] for i in rows))

    def _event(self, step: int, req: Request, res: StepResult, prefix_len: int, ms: float) -> StepEvent:
        tokens, text = req.commit(res.tokens)
        trace = None
        if self.tracer is not None:
            trace = self.tracer.record(step, prefix_len, res, tokens, ms, req.index if len(self.requests) > 1 else None)
        return StepEvent(step, tokens, text, res.accepted_nodes, ms, trace, req.finish is not None, req.finish, req.index)
