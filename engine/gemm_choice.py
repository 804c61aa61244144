"""Which GEMM runs a projection of a fused model: cuBLAS, or our skinny GEMM (engine/kernels/gemv.py).

Neither wins everywhere: on an H100 ours was faster at M = 1 and 16 on most 7B matrices and slower on
some at M = 64, and slower on nearly every small matrix (benchmarks/README.md), and the answer moves
with the GPU. So `auto` times both for each weight shape and row bucket (ROW_BUCKETS) the first time
a forward needs it (a graphed step's warm-up, or an eager forward: prefill, a sampled step), on this
GPU, the way a step's graph runs them: every layer's weight of that shape (and bias) in turn, back to
back in one replayed graph, with clones added until they hold TIMED_BYTES, so that every call reads
its weight from HBM as in a step and not from L2 as a loop over a small model's weights would. It
keeps the faster for the life of the model: at most len(ROW_BUCKETS) timings per shape. Ours must
win by MARGIN: only a clear gain switches the kernel (where the two sit within timing noise of the
margin, two runs can still choose differently, and so round bf16 differently).
At one row the down projection is chosen with its activation (`gated_linear`): cuBLAS after the SiLU * up
kernel, against ours applying it as it loads its input, one launch less; both timings include it.
`skinny` forces ours wherever it applies (bf16/fp16 on CUDA, at most gemv.MAX_ROWS rows), `cublas`
never uses it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from .cudagraph import graphed_us
from .kernels import gemv, pointwise

GEMMS = ("cublas", "skinny", "auto")
MARGIN = 0.02  # ours is chosen only when at least 2 % faster than cuBLAS
ROW_BUCKETS = (1, 16, 32, 64)  # a row count is timed as the smallest bucket that holds it (ours tiles rows by 16/32/64)
TIMED_BYTES = 256 << 20  # over twice the L2 of current GPUs (H100 50 MB, B200 126 MB)

Pair = tuple[torch.Tensor, torch.Tensor | None]  # a projection's (weight, bias)
Timer = Callable[[Callable[[Pair], object], list[Pair]], float]


def row_bucket(rows: int) -> int:
    """The smallest bucket that holds `rows` (at most gemv.MAX_ROWS: more never reach the choice)."""
    return next(b for b in ROW_BUCKETS if rows <= b)


def past_l2(pairs: list[Pair], nbytes: int = TIMED_BYTES) -> list[Pair]:
    """The pairs, then clones of them in turn until the weights hold `nbytes`: timed in a loop, each call
    reads its weight from HBM."""
    size = sum(w.numel() * w.element_size() for w, _ in pairs)
    extra = max(0, -(-(nbytes - size) * len(pairs) // size)) if size else 0
    clones = [(w.clone(), None if b is None else b.clone()) for w, b in itertools.islice(itertools.cycle(pairs), extra)]
    return pairs + clones


class GemmChoice:
    """The GEMM of each (N, K, row bucket) a model's projections meet. `layers`: every projection the model
    runs (timing walks all of one weight shape); `timer(call, pairs)` -> µs per call (a test's fake stands in
    for `graphed_us` on the CPU, with fewer `timed_bytes`)."""

    def __init__(self, mode: str, layers: Iterable[nn.Linear], timer: Timer = graphed_us,
                 timed_bytes: int = TIMED_BYTES):
        if mode not in GEMMS:
            raise ValueError(f"gemm must be one of {', '.join(GEMMS)}, not {mode!r}")
        self.mode, self.timer, self.timed_bytes = mode, timer, timed_bytes
        self.layers: dict[tuple[int, int], list[nn.Linear]] = {}
        for layer in layers:
            self.layers.setdefault(tuple(layer.weight.shape), []).append(layer)
        # (N, K, bucket, gated) -> (cuBLAS µs, ours µs)
        self.timings: dict[tuple[int, int, int, bool], tuple[float, float]] = {}

    def linear(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """layer(x), through the kernel chosen for its weight's shape and x's row count."""
        if self._ours(layer, x, gated=False):
            return gemv.linear(x, layer.weight, layer.bias)
        return layer(x)

    def gated_linear(self, layer: nn.Linear, gate_up: torch.Tensor) -> torch.Tensor:
        """layer(SiLU(gate) * up) of an MLP's stacked gate_up [..., 2F] (the model's fused path: CUDA): at one
        row ours gated or cuBLAS after the activation kernel; at more, the activation kernel, then `linear`."""
        if self._ours(layer, gate_up, gated=True):
            return gemv.linear(gate_up, layer.weight, layer.bias, gated=True)
        act = pointwise.silu_mul(gate_up)
        one_row = gate_up.numel() == gate_up.shape[-1]  # then cuBLAS won the gated choice (or ours does not apply)
        return layer(act) if one_row else self.linear(layer, act)

    def _ours(self, layer: nn.Linear, x: torch.Tensor, gated: bool) -> bool:
        rows = x.numel() // x.shape[-1]
        if self.mode == "cublas" or not gemv.applies(x, rows, gated):
            return False
        return self.mode == "skinny" or self.skinny_wins(layer, rows, gated)

    def skinny_wins(self, layer: nn.Linear, rows: int, gated: bool = False) -> bool:
        """Whether ours runs this layer's shape at this row count (`gated`: with the activation, see
        `gated_linear`): timed once per row bucket, outside any graph capture. A bucket first met inside a
        capture (no eager forward came first) runs cuBLAS in that graph, untimed, and is timed at its first
        eager forward."""
        weight = layer.weight
        key = (*weight.shape, row_bucket(rows), gated)
        if key not in self.timings:
            if weight.is_cuda and torch.cuda.is_current_stream_capturing():
                return False
            pairs = past_l2([(p.weight, p.bias) for p in self.layers.get(tuple(weight.shape)) or [layer]],
                            self.timed_bytes)
            gen = torch.Generator(weight.device).manual_seed(0)  # not the global generator: sampling draws from it
            width = weight.shape[1] * (2 if gated else 1)
            x = torch.randn(key[2], width, device=weight.device, generator=gen).to(weight.dtype)
            if gated:
                timed = (lambda p: F.linear(pointwise.silu_mul(x), *p), lambda p: gemv.linear(x, *p, gated=True))
            else:
                timed = (lambda p: F.linear(x, *p), lambda p: gemv.linear(x, *p))
            self.timings[key] = (self.timer(timed[0], pairs), self.timer(timed[1], pairs))
        cublas, ours = self.timings[key]
        return ours < cublas * (1 - MARGIN)

    def chosen(self) -> list[dict]:
        """What was timed and chosen, for benchmark records: one entry per (N, K, row bucket, gated)."""
        return [{"N": n, "K": k, "rows": rows, "gated": gated, "cublas_us": round(c, 2), "ours_us": round(o, 2),
                 "kernel": "skinny" if o < c * (1 - MARGIN) else "cublas"}
                for (n, k, rows, gated), (c, o) in sorted(self.timings.items())]
