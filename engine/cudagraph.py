"""Capturing one CUDA graph: what every captured path here (the greedy steps, engine/graphs.py; a
traced AR run's heads passes, engine/head_trace.py) does the same way; the stream their events are
recorded on (`current_stream`); and timing work as a graph replays it (`graphed_us`: the GEMM choice,
engine/gemm_choice.py, and `bench --part step`).

The work runs a few times eagerly on a side stream first: Triton compiles and autotunes, cuBLAS
picks its kernels and allocates its workspace, and none of that may happen inside a capture. Those
runs are real (they advance lengths and a ring's slot), so the caller's `reset` puts back what a
later run reads; what they leave past it (K/V past the lengths) is scratch. The graph then records
one more run into the caller's memory pool, whose tensors it keeps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


_STREAMS: dict[tuple[int, int, int], torch.cuda.Stream] = {}


def current_stream(device: torch.device) -> torch.cuda.Stream:
    """The calling thread's current stream on `device`, one kept Stream object per stream. What a step's
    event is recorded on: `Event.record()` with no stream makes a new Stream object (torch.cuda.current_stream)
    at each call, and the record took 15.8 µs of host time a step on an H100's host, where the graph's
    replay took 7.1 (benchmarks/host_breakdown.py --calls, twenty-fifth session). Looked up at every call, not
    kept per run: the current stream is per thread, and a stream's steps may be read from more than one."""
    key = torch._C._cuda_getCurrentStream(device.index)  # (stream id, device index, device type): no object made
    stream = _STREAMS.get(key)
    if stream is None:
        stream = _STREAMS[key] = torch.cuda.Stream(stream_id=key[0], device_index=key[1], device_type=key[2])
    return stream


def capture(run: Callable[[], T], warmups: int, pool, reset: Callable[[], None] = lambda: None
            ) -> tuple[torch.cuda.CUDAGraph, T]:
    """-> the graph of one `run()` and what that run returned (its static outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            run()
            reset()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = run()
    return graph, out


def graphed_us(call: Callable[[T], object], items: list[T], replays: int = 20, calls: int = 64) -> float:
    """µs per call of `call(item)` for each item in turn, as a step's graph runs it: the items repeated to at
    least `calls` calls, captured into one graph and replayed (a replay's launch and synchronisation, ~15 µs,
    then adds < 0.3 µs a call); the median over `replays` timed replays."""
    order = list(items) * -(-calls // len(items))

    def calls_in_turn() -> None:  # each output dropped before the next call: the graph's pool holds about one
        for item in order:
            call(item)

    graph, _ = capture(calls_in_turn, warmups=1, pool=None)
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2] * 1e3 / len(order)
