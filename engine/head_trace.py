"""The heads' top-k of a traced AR run, computed for many steps at once, off the step's path.

An AR step's trace records what each Medusa head would draft after it (`head_topk`: the tree
statistics and the head panel read it). Run inside the step, the heads cost every traced AR step
their ResBlocks and a pass over the vocabulary per head, work the untraced step does not do: on the
demo model on an H100 that made traced AR 1.4x slower than untraced (benchmarks/README.md, "Small
shapes, traced decoding"; there the run is bound by the host, and this design made it slower still:
"Row tiles of 64; the heads of a traced AR run outside its steps"). Here the step only hands back
its hidden state, which goes into a ring on the device, and every `every` steps one heads pass runs
over all the states kept: one batched GEMM per ResBlock and one vocabulary projection for `every`
steps. A traced AR step then runs the untraced step's kernels, its trace kernel and the hidden
state's copy into the ring. On CUDA graphs (`PassGraphs`) that copy is part of the step's graph (on
the fused model inside the verification kernel the untraced step runs too, `HiddenRing`) and a pass
is one replay of its own graph (a run's last, partial pass too): on the demo model every launch of a
traced AR step counts.

Nothing here waits for the GPU while steps are queued: a pass is queued behind the step in flight,
its top-k travels to pinned host memory, and once its event has passed (`hold` looks without
waiting) its fields are read to the host in one copy. `hold` then fills and hands back one step a
call, one per step the session reads, so the host's work per step (the fill, the trace line, the
consumer's) still overlaps a queued step, as in an untraced run. Filled all at once, a pass's
steps were one lump of host work at one step, where the GPU, queued a step ahead, could run dry.
With `every` > 1 a step therefore reaches the stream `every` to 2 x `every` steps after it ran: the
engine uses 16 on CUDA graphs (5-10 ms at the demo's size, 0.1-0.2 s at the 7B shape) and 1 for
the eager runner (on the CPU the pass runs at once; on CUDA, with tensor parallelism or a sampled
AR run, a step is handed out a step late). A stream closed early hands out (and writes) only the
steps handed out by then: a workbench job cut at its deadline drops those still waiting, though
they ran (up to 32 steps, and those queued past the last read).

Step s's head fields come from the hidden state before it (the prompt's last token for step 0), as
when the step ran the heads. A pass's host time counts in the `step_ms` of the step read just before
it (session.StepClock.extend).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import torch

from .cudagraph import capture, current_stream
from .decode import head_topk_fields, micro
from .heads import MedusaHeads
from .kernels import greedy_step
from .trace import StepEvent

HEAD_TRACE_STEPS = 16  # steps per heads pass on CUDA graphs
ROWS_PER_PASS = 64  # hidden states per heads call: bounds the [rows, K, V] logits
WARMUP_PASSES = 2  # eager passes on a side stream before a pass is captured (Triton compiles, cuBLAS picks)


def fused(head_logits: torch.Tensor) -> bool:
    """Whether a heads pass takes its top-k from greedy_step's kernels (CUDA, Triton installed)."""
    return head_logits.is_cuda and greedy_step.triton is not None


def topk_fields(head_logits: torch.Tensor, topk: int) -> torch.Tensor:
    """[rows, K, V] -> [rows, 2 K topk]: `decode.head_topk_fields`. On CUDA the top-k and log-sum-exp
    are greedy_step.row_topk's two launches, on the logits in their own dtype: torch's topk and
    logsumexp took 0.3 ms of host time a pass on an H100, which a demo-sized step cannot hide."""
    if not fused(head_logits):
        return torch.cat(head_topk_fields(head_logits.float(), topk), dim=1)
    rows, k, _ = head_logits.shape
    top = greedy_step.row_topk(head_logits, topk)  # rows r * K + h
    probs = (top.values - top.lse[:, None]).exp()
    return torch.cat((top.ids.view(rows, k * topk), micro(probs).view(rows, k * topk)), dim=1)


def pass_fields(heads: MedusaHeads, lm_head_weight: torch.Tensor, topk: int, hidden: torch.Tensor) -> torch.Tensor:
    """One heads pass: hidden states [rows, d] -> their heads' top-k fields [rows, 2 K topk]."""
    return torch.cat([topk_fields(heads(part, lm_head_weight).transpose(0, 1), topk)
                      for part in hidden.split(ROWS_PER_PASS)])


def new_ring(slots: int, batch: int, dim: int, like: torch.Tensor) -> torch.Tensor:
    """[slots, batch, dim] on `like`'s device and in its dtype, a normal tensor even when made in
    inference mode: the saves of a run outside inference mode write into it."""
    with torch.inference_mode(False):
        return torch.zeros(slots, batch, dim, device=like.device, dtype=like.dtype)


@dataclass(eq=False)  # hashed by identity: the keys of the step graphs that write it hold it
class HiddenRing:
    """Where the captured steps of a traced AR run leave their hidden states: [slots, cap, d] on the
    device, for any batch of up to `cap` rows, and the slot the next step writes. The step's graph
    advances the slot; the host sets it after the prefill's save and after each pass. On the fused
    model the step's verification kernel writes the states and advances the slot
    (`greedy_step.greedy_accept`, which counts its finished programs in `count`): the traced step then
    runs the untraced step's launches and its trace kernel, nothing more."""

    states: torch.Tensor  # [slots, cap, d]
    slot: torch.Tensor  # [1] long
    count: torch.Tensor  # [1] int32, 0 between steps: greedy_accept's programs done

    def write(self, hidden: torch.Tensor) -> None:
        """Captured in an unfused AR step's graph: its hidden states [B, d] into the next slot (two
        launches a step, where the fused step's verification needs none)."""
        self.states[:, : hidden.shape[0]].index_copy_(0, self.slot, hidden[None])
        self.slot.add_(1)


@dataclass
class CapturedPass:
    """A full heads pass (`every` slots of `batch` rows of the ring) as a CUDA graph."""

    graph: torch.cuda.CUDAGraph
    out: torch.Tensor  # [every * batch, 2 K topk]: the fields of the last replay


class PassGraphs:
    """An Engine's ring of hidden states for traced AR runs on CUDA graphs, and its full heads
    passes captured as graphs, one per (heads, top-k, every, batch size), made at a run's first pass
    (its last, partial one, for a run shorter than `every` steps). Launched eagerly a pass is some 25
    kernels, each a launch on the host, which a demo-sized step cannot hide; a partial pass replayed
    computes all `every` slots, the stale ones unread (at batch 1 to 4, one 64-row chunk either way).
    Graphs read the ring by address, so it lives here and the runs share it, one after another (an
    Engine runs one at a time); one ring for every batch size keeps the step graphs that write it to
    one per batch size, as for untraced runs."""

    def __init__(self):
        self.ring: HiddenRing | None = None
        self.passes: dict[tuple, CapturedPass] = {}
        self.pool = None
        self.captures = 0  # tests read it

    def ring_for(self, slots: int, batch: int, like: torch.Tensor) -> HiddenRing:
        """The ring, made again (rows to the next power of two) when `batch` rows or `slots` do not
        fit it; the passes read the old one by address, so they go with it."""
        r = self.ring
        if r is None or r.states.shape[0] != slots or r.states.shape[1] < batch:
            with torch.inference_mode(False):
                slot = torch.zeros(1, dtype=torch.long, device=like.device)
                count = torch.zeros(1, dtype=torch.int32, device=like.device)
            self.ring = HiddenRing(new_ring(slots, 1 << (batch - 1).bit_length(), like.shape[1], like), slot, count)
            self.passes.clear()
        return self.ring

    def get(self, heads: MedusaHeads, lm_head_weight: torch.Tensor, topk: int, every: int, batch: int) -> CapturedPass:
        """The full pass over the ring's first `every` slots and `batch` rows, captured on first use."""
        # the heads object itself: the graph reads its weights by address, and the key keeps them alive
        key = (heads, lm_head_weight.data_ptr(), topk, every, batch)
        if key not in self.passes:
            self.passes[key] = self._capture(heads, lm_head_weight, topk, self.ring.states[:every, :batch])
            self.captures += 1
        return self.passes[key]

    @torch.inference_mode()
    def _capture(self, heads: MedusaHeads, lm_head_weight: torch.Tensor, topk: int, states: torch.Tensor) -> CapturedPass:
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph, out = capture(lambda: pass_fields(heads, lm_head_weight, topk, states.flatten(0, 1)), WARMUP_PASSES,
                             self.pool)
        return CapturedPass(graph, out)


@dataclass
class _Pass:
    """One queued heads pass: the steps it fills, where each event's row is, and its results."""

    steps: list[list[StepEvent]]
    rows: list[int]  # per event, in order: its row of the pass's results
    fields: torch.Tensor  # [rows, 2 K topk] ids then millionths (pinned host memory on CUDA)
    done: torch.cuda.Event | None  # None: computed on the host, ready now


class HeadTrace:
    """The hidden states of a run's recent steps (a device ring), the steps waiting for their heads'
    top-k and the pass in flight. Entries are indexed by step: -1 is the prefill, j AR step j's.
    With `graphs` (CUDA graphs) the ring is the engine's (`graph_ring`), which the captured steps
    write themselves, and a pass is one replay of the full pass's graph."""

    def __init__(self, heads: MedusaHeads, lm_head_weight: torch.Tensor, topk: int, every: int, batch: int,
                 graphs: PassGraphs | None = None, ahead: int = 0):
        if every < 1:
            raise ValueError(f"every must be at least 1 step, not {every}")
        self.heads, self.lm_head_weight, self.topk, self.every = heads, lm_head_weight, topk, every
        # the waiting steps' `every` entries, the newest step's and those of the `ahead` steps queued after it
        self.slots, self.batch, self.graphs = every + 1 + ahead, batch, graphs
        self.graph_ring = graphs.ring_for(self.slots, batch, lm_head_weight) if graphs is not None else None
        # without graphs the ring is made at the first save (the prefill's gives the hidden size)
        self.ring = self.graph_ring.states[:, :batch] if self.graph_ring is not None else None
        self.slot_views: list[torch.Tensor] = list(self.ring) if self.ring is not None else []  # ring[slot] per slot
        self.host = None  # one pass's results; a pass is read before the next one is queued
        if lm_head_weight.is_cuda:
            self.host = torch.empty(self.slots * batch, 2 * heads.num_heads * topk, dtype=torch.long, pin_memory=True)
        self.first = -1  # the step whose entry is in slot 0
        self.rows: list[list[int]] = []  # per slot: the request of each of its rows
        self.waiting: list[tuple[int, list[StepEvent]]] = []  # (step, its events) not yet in a pass
        self.flight: _Pass | None = None
        # steps whose fields are on the host, not yet in their events: (events, each event's row of fields)
        self.arrived: collections.deque[tuple[list[StepEvent], list[list[int]]]] = collections.deque()

    def save(self, step: int, hidden: torch.Tensor, requests: list[int]) -> None:
        """Keep step `step`'s hidden states [B, d] (one row per request in `requests`, kept as it is:
        the session replaces its list of rows, never changes it): a device copy, except for a
        captured step, whose graph wrote them (HiddenRing)."""
        if self.ring is None:
            self.ring = new_ring(self.slots, self.batch, hidden.shape[-1], hidden)
            self.slot_views = list(self.ring)  # made once: a step's save is then one copy launch
        slot = step - self.first
        if slot != len(self.rows) or slot >= self.slots:
            raise RuntimeError(f"step {step}'s hidden state saved out of order (slot {slot} of {len(self.rows)} kept)")
        if self.graph_ring is None or step < 0:
            view = self.slot_views[slot]
            (view if hidden.shape[0] == self.batch else view[: hidden.shape[0]]).copy_(hidden)
            if self.graph_ring is not None:
                self.graph_ring.slot.fill_(1)  # AR step 0 writes the next slot
        self.rows.append(requests)

    def hold(self, step: int, events: list[StepEvent]) -> list[list[StepEvent]]:
        """Take step `step`'s events; -> the oldest step whose fields have arrived, filled (none if
        none has), without waiting for the GPU (unless a full batch of steps finds the previous pass
        still in flight). One step a call, as steps come in: a whole pass handed out at once is a lump
        of host work at one step (each step's trace line, 40 head candidates an event at the demo's 4
        heads x 10), long enough for the GPU, a step ahead, to run out of queued work there."""
        if events:
            self.waiting.append((step, events))
        self._read(wait=False)
        if len(self.waiting) >= self.every:
            self._read(wait=True)
            self._queue_pass()
            self._read(wait=False)
        return self._fill(1)

    def finish(self) -> list[list[StepEvent]]:
        """Every step not yet handed back, filled (waits for the GPU): the run has ended."""
        self._read(wait=True)
        self._queue_pass()
        self._read(wait=True)
        return self._fill(len(self.arrived))

    @torch.inference_mode()
    def _queue_pass(self) -> None:
        """One heads pass over the entries the waiting steps need; then keep only the entries later
        steps still need (the copy is queued behind the pass, so the pass reads them first)."""
        if not self.waiting:
            return
        last = self.waiting[-1][0]
        used = last - self.first  # slots 0 .. used - 1 hold the entries of steps first .. last - 1
        # a run's last pass, over fewer slots, replays the full pass too (one launch, not some 25): its
        # rows of the slots past `used` come from stale states and are never read
        if self.graphs is not None and 0 < used <= self.every:
            full = self.graphs.get(self.heads, self.lm_head_weight, self.topk, self.every, self.batch)
            full.graph.replay()
            fields = full.out
        else:
            fields = pass_fields(self.heads, self.lm_head_weight, self.topk, self.ring[:used].flatten(0, 1))
        batch = self.batch
        rows = [(step - 1 - self.first) * batch + self.rows[step - 1 - self.first].index(ev.request)
                for step, events in self.waiting for ev in events]
        done = None
        if self.host is not None:
            host = self.host[: fields.shape[0]]
            host.copy_(fields, non_blocking=True)
            fields, done = host, torch.cuda.Event()
            done.record(current_stream(self.lm_head_weight.device))
        self.flight = _Pass([events for _, events in self.waiting], rows, fields, done)
        self.waiting = []
        if used:
            kept = len(self.rows) - used
            src = self.ring[used: used + kept]
            self.ring[:kept].copy_(src if kept <= used else src.clone())  # a clone only where they overlap
            self.rows, self.first = self.rows[used:], last
            if self.graph_ring is not None:
                self.graph_ring.slot.fill_(kept)

    def _read(self, wait: bool) -> None:
        """The pass in flight's fields to `arrived`, if it has finished (or `wait`): one read of the
        host buffer, which the next pass may then reuse."""
        p = self.flight
        if p is None or not (wait or p.done is None or p.done.query()):
            return
        if p.done is not None:
            p.done.synchronize()
        self.flight = None
        values = p.fields.tolist()
        rows = iter(p.rows)
        self.arrived.extend((events, [values[next(rows)] for _ in events]) for events in p.steps)

    def _fill(self, most: int) -> list[list[StepEvent]]:
        """Up to `most` of the oldest arrived steps, their events' heads' top-k filled."""
        done = []
        for _ in range(min(most, len(self.arrived))):
            events, fields = self.arrived.popleft()
            for ev, f in zip(events, fields):
                ev.head_fields, ev.topk = f, self.topk  # the trace line reads them as they are
            done.append(events)
        return done
