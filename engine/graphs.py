"""CUDA graphs of whole greedy decode steps: one replay per step instead of hundreds of launches.

A step of the 7B shape is a few hundred small kernels; launched eagerly from Python the host is
the bottleneck (benchmarks/README.md). A captured step is the same kernels replayed with one call.
What is captured, per (tree, batch size, heads object, traced, ring, span): `decode.tree_forward` /
`decode.ar_forward` under greedy acceptance (draft from the heads' top-k, the forward over every
node, verification, KV compaction, the next heads, the length update, and the step trace when
traced; an AR step never runs the heads, engine/head_trace.py), reading and writing static state
tensors this module owns; an AR step traced with the heads' top-k also writes its hidden state into
the engine's `head_trace.HiddenRing`. Lengths come from device tensors, so one graph serves every prefix length:
the triton kernel (and FlashAttention-4's, through seqused_k) sizes its work from them, and for the
sdpa backend (which reads every slot it is given) graphs are captured per span bucket of
SDPA_BUCKET slots. The host reads only the packed step after each replay, through one of
STEPS_AHEAD + 1 pinned buffers: `launch` queues a step and its copy without waiting, `collect` waits
for that step alone, so the session can queue steps N+1 .. N+STEPS_AHEAD before it reads step N
(docs/algorithm.md).

A graph holds raw addresses: of the weights, of the KV cache, of its TreeBuffers (kept here) and of
its static state. So graphs are dropped whenever the model's cache tensors change (a new, larger
cache), and captured again on first use. Requests leaving a batch keep the cache in place
(`KVCache.keep_rows`), so the graph of each smaller batch size is captured once and then reused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trees import TreeBuffers

from .accept import RULES, Rule
from .attention import READS_LIVE_LENGTH
from .cudagraph import capture, current_stream
from .decode import DecodeState, StepTensors, ar_forward, finish_step, fused_greedy, tree_forward
from .head_trace import HiddenRing
from .heads import MedusaHeads
from .model import Transformer
from .sampling import SamplingParams
from .trace import StepEvent

GREEDY = SamplingParams()
WARMUP_STEPS = 2  # eager runs on a side stream before capture (Triton compiles, cuBLAS picks kernels)
SDPA_BUCKET = 512
# steps the session queues beyond the one it reads next, each with its own pinned copy. Two were measured
# on the demo model (benchmarks/README.md, twenty-fourth session) and gained nothing: there an untraced
# run waits for the GPU at every step and a traced AR run is bound by the host's work
STEPS_AHEAD = 1


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    state: DecodeState  # static inputs and outputs: lengths [B], root [B], head_logits [B, K, V] (for the
    # fused tree step, a view of a [K, B, V] buffer in the model's dtype, which the step writes in place)
    out: StepTensors  # static outputs of the last replay
    host: tuple[torch.Tensor, ...]  # STEPS_AHEAD + 1 pinned copies of out.packed, used in turn
    # the events that mark each copy's end, used in the same turn: a new event per step would cost the host an
    # event's creation and destruction each step, where a demo-sized step waits for its host
    done: tuple[torch.cuda.Event, ...]
    turn: int = 0


@dataclass
class Pending:
    """A replayed step whose packed tokens are on their way to `host` (ready when `done` is)."""

    out: StepTensors
    host: torch.Tensor
    done: torch.cuda.Event

    @property
    def hidden(self) -> torch.Tensor | None:
        """An AR step's hidden state (the graph's static output: read it before the next replay)."""
        return self.out.hidden


class StepGraphs:
    """Captured greedy steps for one model (Engine owns one when running on CUDA)."""

    def __init__(self, model: Transformer):
        self.model = model
        self.graphs: dict[tuple, _Captured] = {}
        self.trees: dict[tuple, TreeBuffers] = {}  # a graph reads its tree's buffers by address
        self.pool = None
        self._cache_key: tuple | None = None
        self.captures = 0  # how many graphs were captured (tests and benchmarks read it)

    @staticmethod
    def usable(model: Transformer, rule: Rule, mode: str) -> bool:
        """Graphs need one rank and steps decided on the device: a tree step under a rule with
        `graphs` (greedy), an AR step under a rule that does not sample (its tokens are the argmax)."""
        return model.tp.world == 1 and (rule.graphs if mode == "medusa" else not rule.samples)

    def span(self, state: DecodeState, nodes: int, ahead: int) -> int:
        """Cache slots a captured step reads: the whole cache where the kernel reads live lengths
        (READS_LIVE_LENGTH), else the live prefix (plus the steps still in flight and this step's block)
        rounded up to a bucket."""
        cap = self.model.cache.capacity
        if self.model.backend in READS_LIVE_LENGTH:
            return cap
        need = max(state.host_lengths) + ahead + nodes
        return min(cap, -(-need // SDPA_BUCKET) * SDPA_BUCKET)

    @staticmethod
    def tree_key(choices: list[list[int]] | None) -> tuple | None:
        """The tree's part of a graph's key, made once per run: hashing a 64-node tree's paths at
        every step costs the host about 10 µs, which a synchronous step waits for."""
        return None if choices is None else tuple(map(tuple, choices))

    def step(self, heads: MedusaHeads | None, buf: TreeBuffers | None, tree_key: tuple | None, state: DecodeState,
             trace_topk: int = 0) -> list[StepEvent]:
        """One greedy step (a tree step when buf is given, else AR) by graph replay."""
        return self.collect(self.launch(heads, buf, tree_key, state, trace_topk), state)

    @torch.inference_mode()
    def launch(self, heads: MedusaHeads | None, buf: TreeBuffers | None, tree_key: tuple | None, state: DecodeState,
               trace_topk: int = 0, ahead: int = 0, ring: HiddenRing | None = None) -> Pending:
        """Queue one step and the copy of its packed result; returns at once. `state`'s device
        tensors become the graph's, so a second launch continues from this one without the host
        (`ahead`: tokens the steps still in flight may add, for the sdpa span). tree_key: `tree_key(choices)`.
        ring: an AR step writes its hidden state into it (a traced AR run's heads, engine/head_trace.py)."""
        cache = self.model.cache
        cache_key = (cache.k.data_ptr(), cache.v.data_ptr(), tuple(cache.k.shape))
        if cache_key != self._cache_key:  # their addresses are gone: drop the graphs and their memory
            self.graphs.clear()
            self.pool = None
            self._cache_key = cache_key
        span = self.span(state, buf.num_nodes if buf is not None else 1, ahead)
        # the heads object itself (None for AR): a graph reads its weights by address, so
        # other heads need their own graph; the key also keeps them alive, so no address is ever reused
        key = (tree_key, state.root.shape[0], heads, trace_topk, ring, span)
        g = self.graphs.get(key)
        if g is None:
            g = self.graphs[key] = self._capture(heads, buf, tree_key, state, trace_topk, span, ring)
        s = g.state
        if state.lengths is not s.lengths:  # the caller's state came from prefill or another graph
            s.copy_(state)
        g.graph.replay()
        g.turn = (g.turn + 1) % len(g.host)
        host, done = g.host[g.turn], g.done[g.turn]
        host.copy_(g.out.packed, non_blocking=True)
        done.record(current_stream(s.root.device))
        state.lengths, state.root, state.head_logits = s.lengths, s.root, s.head_logits
        return Pending(g.out, host, done)

    @staticmethod
    def collect(pending: Pending, state: DecodeState) -> list[StepEvent]:
        """Wait for one launched step and read it (trace included: it travelled in the same copy)."""
        pending.done.synchronize()
        return finish_step(state, pending.out, pending.host.tolist())

    def _capture(self, heads, buf, tree_key, state: DecodeState, trace_topk: int, span: int,
                 ring: HiddenRing | None) -> _Captured:
        static = state.clone()
        if buf is not None:
            buf = self.trees.setdefault(tree_key, buf)
        if buf is not None and fused_greedy(self.model, RULES["greedy"], state):
            # the heads' logits as the heads write them, [K, B, V] in the model's dtype seen as [B, K, V]: the
            # fused step writes them in place (decode._tree_forward_fused), and no copy joins the graph
            k_b_v = state.head_logits.transpose(0, 1)
            static.head_logits = torch.empty(k_b_v.shape, dtype=self.model.lm_head.weight.dtype,
                                             device=k_b_v.device).transpose(0, 1).copy_(state.head_logits)

        def body() -> StepTensors:
            work = DecodeState(static.lengths, static.host_lengths, static.root, static.head_logits)
            if buf is not None:
                out = tree_forward(self.model, heads, buf, work, RULES["greedy"], GREEDY, None, span=span,
                                   trace=bool(trace_topk))
            else:
                out = ar_forward(self.model, work, GREEDY, None, span=span, trace_topk=trace_topk, ring=ring)
            static.copy_(work)
            return out

        # warm-up steps run for real: each is undone (the static state and the ring's slot are restored; the
        # K/V past the lengths and the ring's row at the slot are scratch, written again by the real step)
        saved = static.clone()
        saved_slot = ring.slot.clone() if ring is not None else None

        def undo() -> None:
            static.copy_(saved)
            if ring is not None:
                ring.slot.copy_(saved_slot)

        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph, out = capture(body, WARMUP_STEPS, self.pool, undo)
        self.captures += 1
        host = tuple(torch.empty(out.packed.shape, dtype=out.packed.dtype, pin_memory=True)
                     for _ in range(STEPS_AHEAD + 1))
        return _Captured(graph, static, out, host, tuple(torch.cuda.Event() for _ in host))
