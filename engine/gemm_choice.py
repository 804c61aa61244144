"""Which GEMM runs a projection of a graphed step: cuBLAS, or our skinny GEMM (engine/kernels/gemv.py).

Neither wins everywhere: on an H100 ours was faster at M = 1 and 16 on most 7B matrices and slower on
some at M = 64 (benchmarks/README.md), and the answer moves with the GPU. So `auto` times both for
each weight shape and row count the first time a step needs it, on this GPU, the way a step's graph
runs them: every layer's weight of that shape in turn, back to back in one replayed graph (so a
weight is read from HBM as in the step, not from L2 as a repeated call would), and keeps the faster
for the life of the model. Ours must win by MARGIN, so that a near-tie goes to cuBLAS on every run
and the kernels (hence the bf16 rounding) do not flip between runs of the same model on one GPU.
`skinny` forces ours wherever it applies (bf16/fp16 on CUDA, at most gemv.MAX_ROWS rows), `cublas`
never uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from .cudagraph import graphed_us
from .kernels import gemv

GEMMS = ("cublas", "skinny", "auto")
MARGIN = 0.02  # ours is chosen only when at least 2 % faster than cuBLAS

Timer = Callable[[Callable[[torch.Tensor], object], list[torch.Tensor]], float]


class GemmChoice:
    """The GEMM of each (N, K, rows) a model's projections meet. `weights`: every projection weight the
    model runs (timing walks all of one shape); `timer(call, weights)` -> µs per call (a test's fake
    stands in for `graphed_us` on the CPU)."""

    def __init__(self, mode: str, weights: Iterable[torch.Tensor], timer: Timer = graphed_us):
        if mode not in GEMMS:
            raise ValueError(f"gemm must be one of {', '.join(GEMMS)}, not {mode!r}")
        self.mode, self.timer = mode, timer
        self.weights: dict[tuple[int, int], list[torch.Tensor]] = {}
        for w in weights:
            self.weights.setdefault(tuple(w.shape), []).append(w)
        self.timings: dict[tuple[int, int, int], tuple[float, float]] = {}  # (N, K, rows) -> (cuBLAS µs, ours µs)

    def linear(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """layer(x), through the kernel chosen for its weight's shape and x's row count."""
        rows = x.numel() // x.shape[-1]
        if self.mode == "cublas" or not gemv.applies(x, rows):
            return layer(x)
        if self.mode == "skinny" or self.skinny_wins(layer.weight, rows):
            return gemv.linear(x, layer.weight, layer.bias)
        return layer(x)

    def skinny_wins(self, weight: torch.Tensor, rows: int) -> bool:
        """Whether ours runs this shape at this row count: timed once, outside any graph capture. A
        shape first met inside a capture (no eager step came first) runs cuBLAS in that graph, untimed."""
        key = (*weight.shape, rows)
        if key not in self.timings:
            if weight.is_cuda and torch.cuda.is_current_stream_capturing():
                return False
            same = self.weights.get(tuple(weight.shape)) or [weight]
            gen = torch.Generator(weight.device).manual_seed(0)  # not the global generator: sampling draws from it
            x = torch.randn(rows, weight.shape[1], device=weight.device, generator=gen).to(weight.dtype)
            self.timings[key] = (self.timer(lambda w: F.linear(x, w), same), self.timer(lambda w: gemv.linear(x, w), same))
        cublas, ours = self.timings[key]
        return ours < cublas * (1 - MARGIN)

    def chosen(self) -> list[dict]:
        """What was timed and chosen, for benchmark records: one entry per (N, K, rows)."""
        return [{"N": n, "K": k, "rows": rows, "cublas_us": round(c, 2), "ours_us": round(o, 2),
                 "kernel": "skinny" if o < c * (1 - MARGIN) else "cublas"}
                for (n, k, rows), (c, o) in sorted(self.timings.items())]
