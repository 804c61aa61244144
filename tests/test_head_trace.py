"""engine/head_trace.py's path on CUDA graphs, driven on the CPU: a full pass replays a graph that
reads the ring it was captured on, so the steps' saves must land where that replay reads them, run
after run on one engine (the ring is kept), with requests leaving and runs closed early."""

import pytest
import torch

from engine.head_trace import CapturedPass, HeadTrace, PassGraphs, pass_fields
from engine.trace import StepEvent


class ReplayedPass:
    """Stands in for a captured pass's CUDA graph: a replay runs the pass over the ring's first slots."""

    def __init__(self, heads, weight, topk: int, rows: torch.Tensor, out: torch.Tensor):
        self.heads, self.weight, self.topk, self.rows, self.out = heads, weight, topk, rows, out
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        self.out.copy_(pass_fields(self.heads, self.weight, self.topk, self.rows))


def cpu_pass_graphs(monkeypatch) -> PassGraphs:
    def capture(self, heads, weight, topk, ring):
        every, batch = ring.shape[0] - 2, ring.shape[1]
        out = torch.empty(every * batch, 2 * heads.num_heads * topk, dtype=torch.long)
        # the CPU has no events: the host buffer is None, so a pass's fields are read where they are
        return CapturedPass(ring, ReplayedPass(heads, weight, topk, ring[:every].flatten(0, 1), out), out, None)

    monkeypatch.setattr(PassGraphs, "_capture", capture)
    return PassGraphs()


def run(graphs: PassGraphs, heads, weight, topk: int, every: int, leaves: dict[int, int], ahead: bool,
        gen: torch.Generator, close_after: int | None = None):
    """One traced AR run of len(leaves) requests (request -> its last step), its steps launched and
    read the way the session does -> (the steps handed out, each step's hidden states and rows)."""
    batch, last = len(leaves), max(leaves.values())
    trace = HeadTrace(heads, weight, topk, every, batch, graphs)
    hidden = {-1: torch.randn(batch, weight.shape[1], generator=gen)}
    rows_at = {-1: list(range(batch))}
    trace.save(-1, hidden[-1], rows_at[-1])
    got: list[list[StepEvent]] = []

    def launch(step: int) -> None:
        rows_at[step] = [r for r in range(batch) if leaves[r] >= step]
        hidden[step] = torch.randn(len(rows_at[step]), weight.shape[1], generator=gen)
        trace.save(step, hidden[step], rows_at[step])

    launch(0)
    for step in range(last + 1):
        if ahead and step < last:
            launch(step + 1)
        got += trace.hold(step, [StepEvent([1], [0], step=step, request=r) for r in rows_at[step]])
        if close_after is not None and len(got) >= close_after:
            return got, hidden, rows_at  # a stream closed early: the rest is never read
        if not ahead and step < last:
            launch(step + 1)
    return got + trace.finish(), hidden, rows_at


def assert_heads_of_the_step_before(got, hidden, rows_at, heads, weight, topk):
    for evs in got:
        for ev in evs:
            before = hidden[ev.step - 1][rows_at[ev.step - 1].index(ev.request)]
            want = pass_fields(heads, weight, topk, before[None])[0].tolist()
            assert [t for h in ev.head_topk for t, _ in h] == want[: topk * heads.num_heads], (ev.step, ev.request)


@pytest.mark.parametrize("every", [1, 3, 16])
@pytest.mark.parametrize("ahead", [False, True])
def test_replayed_passes_read_what_the_steps_saved(demo_engine, monkeypatch, every, ahead):
    """Full passes replay the captured graph over the ring the steps saved into (possibly one step
    ahead of the read), requests leave the batch at different steps, and every step gets the heads'
    top-k of its request's previous hidden state, in order; a run closed early leaves the next run of
    that batch size, on the same ring, correct."""
    heads, weight, topk = demo_engine.heads, demo_engine.model.lm_head.weight, 4
    graphs = cpu_pass_graphs(monkeypatch)
    gen = torch.Generator().manual_seed(every)
    got, hidden, rows_at = run(graphs, heads, weight, topk, every, {0: 5, 1: 40, 2: 23}, ahead, gen)
    assert [evs[0].step for evs in got] == list(range(41))
    assert_heads_of_the_step_before(got, hidden, rows_at, heads, weight, topk)
    (full,) = graphs.passes.values()
    assert full.graph.replays == 41 // every  # full passes replayed; the last, partial one runs eagerly
    run(graphs, heads, weight, topk, every, {0: 30, 1: 30, 2: 30}, ahead, gen, close_after=7)
    got, hidden, rows_at = run(graphs, heads, weight, topk, every, {0: 33, 1: 20, 2: 33}, ahead, gen)
    assert_heads_of_the_step_before(got, hidden, rows_at, heads, weight, topk)
    assert list(graphs.passes.values()) == [full] and graphs.captures == 1  # one batch size, one capture
    got, hidden, rows_at = run(graphs, heads, weight, topk, every, {0: 19}, ahead, gen)
    assert_heads_of_the_step_before(got, hidden, rows_at, heads, weight, topk)
    assert graphs.captures == 2  # a batch of one has its own ring and pass


@pytest.mark.parametrize("graphed", [False, True])
def test_a_ring_made_in_inference_mode_takes_saves_made_outside_it(demo_engine, monkeypatch, graphed):
    """A run may start inside torch.inference_mode() (a caller's, or a capture's) and save outside it:
    the ring must be a normal tensor, or the save's copy raises."""
    heads, weight = demo_engine.heads, demo_engine.model.lm_head.weight
    graphs = cpu_pass_graphs(monkeypatch) if graphed else None
    hidden = torch.randn(2, weight.shape[1])
    with torch.inference_mode():
        trace = HeadTrace(heads, weight, 4, 3, 2, graphs)
        trace.save(-1, hidden, [0, 1])
    trace.save(0, hidden, [0, 1])
    assert torch.equal(trace.ring[1], hidden)
