"""engine/head_trace.py's captured path, driven on the CPU: the ring's slot, which a captured AR step
advances on the device and each pass resets, must name the slot the host's bookkeeping expects."""

import pytest
import torch

from engine.head_trace import CapturedPass, HeadTrace, new_ring, pass_fields
from engine.trace import StepEvent


class ReplayedPass:
    """Stands in for a captured pass's CUDA graph: a replay runs the pass over the ring's first slots."""

    def __init__(self, heads, weight, topk: int, every: int):
        self.heads, self.weight, self.topk, self.every = heads, weight, topk, every
        self.captured: CapturedPass | None = None
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        rows = self.captured.ring[: self.every].flatten(0, 1)
        self.captured.out.copy_(pass_fields(self.heads, self.weight, self.topk, rows))


@pytest.mark.parametrize("every", [1, 3, 16])
@pytest.mark.parametrize("ahead", [False, True])
def test_steps_written_by_the_graph_get_the_heads_of_the_step_before(demo_engine, every, ahead):
    """Hidden states enter the ring as a captured AR step puts them there (CapturedPass.write, at
    launch, possibly one step ahead of the read), requests leave the batch at different steps, and
    every step gets the heads' top-k of its request's previous hidden state, in order."""
    heads, weight, topk, batch = demo_engine.heads, demo_engine.model.lm_head.weight, 4, 3
    graph = ReplayedPass(heads, weight, topk, every)
    ring = new_ring(every + 2, batch, weight.shape[1], weight)
    out = torch.empty(every * batch, 2 * heads.num_heads * topk, dtype=torch.long)
    graph.captured = CapturedPass(ring, torch.zeros(1, dtype=torch.long), graph, out, None)

    class Graphs:
        def get(self, *key):
            return graph.captured

    trace = HeadTrace(heads, weight, topk, every, batch, Graphs())
    trace.host = None  # the CPU has no events: a pass's fields are read where they are
    gen = torch.Generator().manual_seed(every)
    leaves = {0: 5, 1: 40, 2: 23}  # request -> its last step
    hidden = {-1: torch.randn(batch, weight.shape[1], generator=gen)}
    trace.save(-1, hidden[-1], [0, 1, 2])
    rows_at = {-1: [0, 1, 2]}
    got: list[list[StepEvent]] = []

    def launch(step: int) -> None:
        rows = [r for r in (0, 1, 2) if leaves[r] >= step]
        rows_at[step] = rows
        hidden[step] = torch.randn(len(rows), weight.shape[1], generator=gen)
        graph.captured.write(hidden[step])  # what the step's graph does at replay
        trace.save(step, hidden[step], rows)

    launch(0)
    for step in range(41):
        if ahead and step < 40:
            launch(step + 1)
        events = [StepEvent([1], [0], step=step, request=r) for r in rows_at[step]]
        got += trace.hold(step, events)
        if not ahead and step < 40:
            launch(step + 1)
    got += trace.finish()
    assert [evs[0].step for evs in got] == list(range(41))
    assert graph.replays == 41 // every  # full passes replayed; the last, partial one runs eagerly
    for evs in got:
        for ev in evs:
            before = hidden[ev.step - 1][rows_at[ev.step - 1].index(ev.request)]
            want = pass_fields(heads, weight, topk, before[None])[0].tolist()
            ids = [t for h in ev.head_topk for t, _ in h]
            assert ids == want[: len(ids)], (ev.step, ev.request)

