"""Capturing one CUDA graph: what every captured path here (the greedy steps, engine/graphs.py; a
traced AR run's heads passes, engine/head_trace.py) does the same way.

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
