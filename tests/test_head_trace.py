"""engine/head_trace.py's path on CUDA graphs, driven on the CPU: the ring's slot, which a captured AR
step advances on the device and the host sets after the prefill and after each pass, must name the
slot the host's bookkeeping expects, run after run on one engine's ring."""

import pytest
import torch

from engine.head_trace import CapturedPass, HeadTrace, PassGraphs, pass_fields
from engine.trace import MICRO, StepEvent


class ReplayedPass:
    """Stands in for a captured pass's CUDA graph: a replay runs the pass over the rows it was made for."""

    def __init__(self, heads, weight, topk: int, states: torch.Tensor, out: torch.Tensor):
        self.heads, self.weight, self.topk, self.states, self.out = heads, weight, topk, states, out
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        self.out.copy_(pass_fields(self.heads, self.weight, self.topk, self.states.flatten(0, 1)))


def cpu_pass_graphs(monkeypatch) -> PassGraphs:
    def capture(self, heads, weight, topk, states):
        out = torch.empty(states.shape[0] * states.shape[1], 2 * heads.num_heads * topk, dtype=torch.long)
        return CapturedPass(ReplayedPass(heads, weight, topk, states, out), out)

    monkeypatch.setattr(PassGraphs, "_capture", capture)
    return PassGraphs()


def run(graphs: PassGraphs, heads, weight, topk: int, every: int, leaves: dict[int, int], ahead: int,
        gen: torch.Generator, close_after: int | None = None):
    """One traced AR run of len(leaves) requests (request -> its last step), its steps launched the way
    the session launches them, `ahead` steps beyond the one read -> (the steps handed out, each step's
    hidden states and rows)."""
    batch, last = len(leaves), max(leaves.values())
    trace = HeadTrace(heads, weight, topk, every, batch, graphs, ahead=ahead)
    trace.host = None  # the CPU has no events: a pass's fields are read where they are
    hidden = {-1: torch.randn(batch, weight.shape[1], generator=gen)}
    rows_at = {-1: list(range(batch))}
    trace.save(-1, hidden[-1], rows_at[-1])
    got: list[list[StepEvent]] = []

    def launch_to(upto: int) -> None:
        """Launch every step up to `upto` not launched yet."""
        for step in range(len(rows_at) - 1, min(upto, last) + 1):
            rows_at[step] = [r for r in range(batch) if leaves[r] >= step]
            hidden[step] = torch.randn(len(rows_at[step]), weight.shape[1], generator=gen)
            trace.graph_ring.write(hidden[step])  # what the step's graph does at replay
            trace.save(step, hidden[step], rows_at[step])

    launch_to(0)
    for step in range(last + 1):
        launch_to(step + ahead)
        out = trace.hold(step, [StepEvent([1], [0], step=step, request=r) for r in rows_at[step]])
        assert len(out) <= 1  # filled one step a call: a pass's Python work spread over the steps
        got += out
        if close_after is not None and len(got) >= close_after:
            return got, hidden, rows_at  # a stream closed early: the rest is never read
        launch_to(step + 1)
    return got + trace.finish(), hidden, rows_at


def assert_heads_of_the_step_before(got, hidden, rows_at, heads, weight, topk):
    for evs in got:
        for ev in evs:
            before = hidden[ev.step - 1][rows_at[ev.step - 1].index(ev.request)]
            want = pass_fields(heads, weight, topk, before[None])[0].tolist()  # ids, then millionths
            n = topk * heads.num_heads
            got = [c for h in ev.head_topk for c in h]
            assert [t for t, _ in got] == want[:n] and all(len(h) == topk for h in ev.head_topk), (ev.step, ev.request)
            # a pass over more rows may round a probability to the next millionth
            assert max(abs(p - m / MICRO) for (_, p), m in zip(got, want[n:])) <= 1.5e-6, (ev.step, ev.request)


@pytest.mark.parametrize("every", [1, 3, 16])
@pytest.mark.parametrize("ahead", [0, 1, 2])
def test_steps_written_by_their_graph_get_the_heads_of_the_step_before(demo_engine, monkeypatch, every, ahead):
    """Hidden states enter the engine's ring as a captured AR step puts them there (HiddenRing.write,
    at launch, up to two steps ahead of the read), requests leave the batch at different steps, and
    every step gets the heads' top-k of its request's previous hidden state, in order; a run closed
    early leaves the next run (a smaller batch, on the same ring) correct."""
    heads, weight, topk = demo_engine.heads, demo_engine.model.lm_head.weight, 4
    graphs = cpu_pass_graphs(monkeypatch)
    gen = torch.Generator().manual_seed(every)
    got, hidden, rows_at = run(graphs, heads, weight, topk, every, {0: 5, 1: 40, 2: 23}, ahead, gen)
    assert [evs[0].step for evs in got] == list(range(41))
    assert_heads_of_the_step_before(got, hidden, rows_at, heads, weight, topk)
    (full,) = graphs.passes.values()
    assert full.graph.replays == -(-41 // every)  # every pass replayed, the last, partial one too
    ring = graphs.ring
    run(graphs, heads, weight, topk, every, {0: 30, 1: 30, 2: 30}, ahead, gen, close_after=7)
    got, hidden, rows_at = run(graphs, heads, weight, topk, every, {0: 33, 1: 20}, ahead, gen)
    assert_heads_of_the_step_before(got, hidden, rows_at, heads, weight, topk)
    assert graphs.ring is ring and ring.states.shape[1] == 4  # three rows and two share one ring of four


def test_a_run_shorter_than_a_pass_replays_the_full_pass_and_never_reads_its_stale_rows(demo_engine, monkeypatch):
    """A run of fewer steps than `every` has only a partial pass: it captures and replays the full pass, whose
    rows of the slots past the run's entries come from stale states (here NaN) and are never handed out."""
    heads, weight, topk = demo_engine.heads, demo_engine.model.lm_head.weight, 4
    graphs = cpu_pass_graphs(monkeypatch)
    gen = torch.Generator().manual_seed(5)
    got, hidden, rows_at = run(graphs, heads, weight, topk, 16, {0: 4, 1: 2}, 2, gen)
    assert [evs[0].step for evs in got] == list(range(5))
    assert_heads_of_the_step_before(got, hidden, rows_at, heads, weight, topk)
    (full,) = graphs.passes.values()
    assert full.graph.replays == 1
    graphs.ring.states[8:].fill_(float("nan"))
    got, hidden, rows_at = run(graphs, heads, weight, topk, 16, {0: 6, 1: 3}, 2, gen)
    assert_heads_of_the_step_before(got, hidden, rows_at, heads, weight, topk)
    assert full.graph.replays == 2 and len(graphs.passes) == 1


def test_a_larger_batch_makes_a_larger_ring_and_drops_the_passes_on_the_old_one(demo_engine, monkeypatch):
    heads, weight = demo_engine.heads, demo_engine.model.lm_head.weight
    graphs = cpu_pass_graphs(monkeypatch)
    gen = torch.Generator().manual_seed(0)
    run(graphs, heads, weight, 4, 3, {0: 10, 1: 10}, 1, gen)
    small = graphs.ring
    assert small.states.shape[1] == 2 and len(graphs.passes) == 1
    got, hidden, rows_at = run(graphs, heads, weight, 4, 3, {r: 9 + r for r in range(5)}, 2, gen)
    assert graphs.ring is not small and graphs.ring.states.shape[1] == 8
    assert [key[-1] for key in graphs.passes] == [5]  # batch 5's pass, on the new ring
    assert_heads_of_the_step_before(got, hidden, rows_at, heads, weight, 4)


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
    if graphed:
        trace.graph_ring.write(hidden)  # what AR step 0's graph does
    trace.save(0, hidden, [0, 1])
    assert torch.equal(trace.ring[1], hidden)
