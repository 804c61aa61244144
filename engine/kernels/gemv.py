"""Skinny GEMMs (M = 1..64 rows: a batch-1 AR step, or a tree step's nodes): the torch reference
(F.linear, cuBLAS on CUDA) and a Triton kernel that streams each weight once.

At batch 1 a projection is bound by reading its weight: W [N, K] bf16 is N*K*2 bytes whatever M is.
cuBLAS's batch-1 kernels reached ~84 % of copy bandwidth on an H200 (benchmarks/README.md). Here
one program owns BLOCK_N output features and walks K in BLOCK_K tiles, software-pipelined
(num_stages), keeping every row of x in the same tile: W is read exactly once, in 16-byte-aligned
rows, and x (small) comes from L2. Where N alone gives too few programs to fill the GPU, K is split:
each split writes its fp32 partial to a workspace and counts itself in on a per-column-block
counter, and the split that arrives last adds the partials (and the bias) and writes the output in
its dtype. One launch besides the counters' memset, where atomics into a zeroed fp32 buffer needed
a memset of the whole output and a cast kernel after: inside a step's graph each small kernel costs
~1-2 µs. `bench --part step` times it against cuBLAS per shape; the engine uses it only where it
measured faster (the `skinny_gemm` switch of `loading.build_model`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs use the reference
    triton = None

MAX_ROWS = 64


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x, weight, bias)


if triton is not None:

    @triton.autotune(
        configs=[triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
                 for bn, bk, w, s in ((32, 256, 4, 4), (64, 128, 4, 4), (64, 256, 8, 3), (128, 128, 8, 3),
                                      (16, 512, 4, 3), (32, 512, 8, 3))],
        key=["M_BLOCK", "N", "K", "SPLIT_K"],
        reset_to_zero=["COUNT"],  # every timed config starts with its split counters at zero
    )
    @triton.jit
    def _skinny(X, W, B, Y, PART, COUNT, M, N, K, sx, sw, sy,
                HAS_BIAS: tl.constexpr, M_BLOCK: tl.constexpr, SPLIT_K: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rows = tl.arange(0, M_BLOCK)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < M
        col_ok = cols < N
        per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
        k_lo = pid_k * per_split
        acc = tl.zeros([M_BLOCK, BLOCK_N], tl.float32)
        for k0 in range(k_lo, tl.minimum(k_lo + per_split, K), BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            x = tl.load(X + rows[:, None] * sx + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(W + cols[:, None] * sw + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            acc += tl.dot(x, tl.trans(w))
        ok = row_ok[:, None] & col_ok[None, :]
        tile = rows[:, None] * N + cols[None, :]
        last = True
        if SPLIT_K > 1:
            tl.store(PART + pid_k * M * N + tile, acc, mask=ok)
            tl.debug_barrier()  # every thread's partial is stored before the program counts itself in
            # release: this split's partial is visible before its count; acquire: the last one sees every partial
            arrived = tl.atomic_add(COUNT + pid_n, 1, sem="acq_rel")
            last = arrived == SPLIT_K - 1
            if last:
                acc = tl.zeros([M_BLOCK, BLOCK_N], tl.float32)
                for s in range(SPLIT_K):  # .cg: read from L2, past this SM's L1
                    acc += tl.load(PART + s * M * N + tile, mask=ok, other=0.0, cache_modifier=".cg")
        if last:
            if HAS_BIAS:
                acc += tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            tl.store(Y + rows[:, None] * sy + cols[None, :], acc.to(Y.dtype.element_ty), mask=ok)


_SM: dict[int, int] = {}


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear for x with at most MAX_ROWS rows (any leading shape), bf16/fp16 on CUDA; else the reference."""
    rows = x.numel() // x.shape[-1]
    if triton is None or not x.is_cuda or rows > MAX_ROWS or x.dtype not in (torch.bfloat16, torch.float16):
        return linear_reference(x, weight, bias)
    n, k = weight.shape
    x2 = x.reshape(rows, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
    if dev not in _SM:
        _SM[dev] = torch.cuda.get_device_properties(dev).multi_processor_count
    split = 1 if n >= 64 * _SM[dev] else max(1, min(8, (2 * _SM[dev] * 64) // n))  # enough programs to fill the GPU
    m_block = max(16, triton.next_power_of_2(rows))
    y = torch.empty(rows, n, device=x.device, dtype=x.dtype)
    part, count = y, y  # unused by one split: no workspace, no memset
    if split > 1:
        part = torch.empty(split, rows, n, device=x.device, dtype=torch.float32)
        count = torch.zeros(triton.cdiv(n, 16), device=x.device, dtype=torch.int32)  # >= one per column block

    def grid(meta):
        return (triton.cdiv(n, meta["BLOCK_N"]), split)

    _skinny[grid](x2, weight, bias if bias is not None else weight, y, part, count, rows, n, k, x2.stride(0),
                  weight.stride(0), y.stride(0), HAS_BIAS=bias is not None, M_BLOCK=m_block, SPLIT_K=split)
    return y.reshape(*x.shape[:-1], n)
