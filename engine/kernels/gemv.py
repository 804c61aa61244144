"""Skinny GEMMs (M = 1..64 rows: a batch-1 AR step, or a tree step's nodes): the torch reference
(F.linear, cuBLAS on CUDA) and a Triton kernel that streams each weight once.

At batch 1 a projection is bound by reading its weight: W [N, K] bf16 is N*K*2 bytes whatever M is.
cuBLAS's batch-1 kernels reached ~84 % of copy bandwidth on an H200 (benchmarks/README.md). Here
one program owns BLOCK_N output features and walks K in BLOCK_K tiles, software-pipelined
(num_stages), keeping every row of x in the same tile: W is read exactly once, in 16-byte-aligned
rows, and x (small) comes from L2. Where N alone gives too few programs to fill the GPU, K may be split
(autotuned with the block shape: no split, or the splits that give one to four programs per SM): each
split writes its fp32 partial to a workspace and counts itself in on a per-column-block counter,
and the split that arrives last adds the partials (and the bias), writes the output in its dtype
and sets its counter back to zero. The counters are one zeroed buffer per device that every call
leaves zeroed, so a call is one launch: atomics into a zeroed fp32 buffer needed a memset of the
whole output and a cast kernel after, and counters zeroed per call a memset, where inside a step's
graph each small kernel costs ~1-2 µs. Calls on one device must therefore not overlap: an engine
runs one stream at a time, but two engines on one device driven from two threads at once would share
the counters. `gated` (one row: a batch-1 AR step): x is an MLP's stacked gate_up [1, 2K] and the
kernel applies SiLU(gate) * up as it loads it (pointwise.silu_mul_tile, the activation kernel's own
arithmetic), so the down projection needs no activation kernel before it: one launch a layer less.
Every column block computes the activation of its K-slice again: at one row that is K exps a block,
but over a 16-row tile (as the dot pads one row to) it made the 7B down projection 6 µs slower than
ungated, and at 32 rows 35 µs (one H100, benchmarks/README.md), more than the ~2 µs activation
kernel it saves. `bench --part step` times it against cuBLAS per shape; the engine uses it where
`gemm` says (engine/gemm_choice.py: `auto` times both per shape and row bucket on the GPU it runs on).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs use the reference
    triton = None

from . import pdl

if triton is not None:
    from .pdl import wait_then_release

from .pointwise import silu_mul_reference

if triton is not None:
    from .pointwise import silu_mul_tile

MAX_ROWS = 64


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     gated: bool = False) -> torch.Tensor:
    """F.linear(x), or with `gated` F.linear(SiLU(gate) * up) of x = [..., gate | up]."""
    return F.linear(silu_mul_reference(x) if gated else x, weight, bias)


# (BLOCK_N, BLOCK_K, warps, stages). The wide blocks (128, 256) are for M = 64: every column block reads all of x
# from L2, so at 64 rows narrow blocks read x several times the weight's own bytes
BLOCKS = ((32, 256, 4, 4), (64, 128, 4, 4), (64, 256, 8, 3), (128, 128, 8, 3), (16, 512, 4, 3), (32, 512, 8, 3),
          (128, 64, 4, 4), (256, 64, 8, 3))
SPLITS = (1, 2, 4, 8)
SPLIT_BELOW = 64  # K is split only for N under this many outputs per SM: larger N fills the GPU with column blocks
MIN_BLOCK_N = min(bn for bn, *_ in BLOCKS)  # a split N has at most SPLIT_BELOW * sm / MIN_BLOCK_N column blocks
SMEM_BYTES = 227 * 1024  # Hopper's shared memory per block: a config whose pipelined tiles need more cannot launch


def splits_for(n: int, block_n: int, sm: int) -> tuple[int, ...]:
    """The K splits worth timing for N outputs in blocks of `block_n` on `sm` SMs. None but 1 from SPLIT_BELOW
    outputs per SM up: a matrix that large needs no split, and one that may split writes a workspace of partials
    whichever config won. Below it (at most 4 * sm column blocks for any block of 16 or more): 1, and of the
    splits 2-8 those that give one to four programs per SM (splitting further only adds partials to sum), else
    the largest. No split is a candidate though it under-fills the GPU: at 64 rows a split writes and re-reads 64
    fp32 rows per column. At the 7B shape on one H100 (benchmarks/README.md, "Unsplit GEMMs at 64 rows") the
    o-projection's best split took 18.7 µs at 64 rows and the sweep's variant of the same loop unsplit 15.8
    (cuBLAS 14.4); with no split among the candidates the tuner's pick took 13.9 (cuBLAS 14.8)."""
    if n >= SPLIT_BELOW * sm:
        return (1,)
    blocks = -(-n // block_n)
    return (1,) + (tuple(s for s in SPLITS[1:] if sm <= blocks * s <= 4 * sm) or (SPLITS[-1],))


@functools.cache
def max_split(n: int, sm: int) -> int:
    """The most K splits any config may use for N outputs on `sm` SMs: the partials' workspace is sized for it
    (SM is part of the tuning key, so a config tuned on another GPU never runs past it)."""
    return max(max(splits_for(n, bn, sm)) for bn, *_ in BLOCKS)


_SM: dict[int, int] = {}


def sm_count(device: torch.device) -> int:
    dev = device.index if device.index is not None else torch.cuda.current_device()
    if dev not in _SM:
        _SM[dev] = torch.cuda.get_device_properties(dev).multi_processor_count
    return _SM[dev]


def _worth_timing(configs: list, named_args: dict, **kwargs) -> list:
    """Autotuning's early prune: each block shape with the splits that suit this N, none whose tiles overflow
    shared memory at this M (a gated input loads two one-row vectors, gate and up, in place of M_BLOCK rows)."""
    n, sm = named_args["N"], named_args["SM"]
    x_rows = 2 if kwargs["GATED"] else kwargs["M_BLOCK"]
    return [c for c in configs
            if c.kwargs["SPLIT_K"] in splits_for(n, c.kwargs["BLOCK_N"], sm)
            and (x_rows + c.kwargs["BLOCK_N"]) * c.kwargs["BLOCK_K"] * 2 * c.num_stages <= SMEM_BYTES]


if triton is not None:

    @triton.jit
    def _tile_rows(acc, X, w, rows, ks, k_ok, M, sx, GATED: tl.constexpr, K):
        """acc + this K tile's product for `rows` of x: W is the loaded weight tile [BLOCK_N, BLOCK_K]."""
        if GATED:  # X [1, 2K]: gate, then up K columns on; the activation of one row, put in row 0 of the tile
            act = silu_mul_tile(tl.load(X + ks, mask=k_ok, other=0.0), tl.load(X + K + ks, mask=k_ok, other=0.0))
            x = tl.where(rows[:, None] == 0, act[None, :], 0.0).to(act.dtype)
        else:
            x = tl.load(X + rows[:, None] * sx + ks[None, :], mask=(rows < M)[:, None] & k_ok[None, :], other=0.0)
        return tl.dot(x, tl.trans(w), acc)

    @triton.jit
    def _finish_rows(acc, B, Y, PART, rows, cols, col_ok, M, N, sy, pid_k, last: tl.constexpr, SPLIT_K,
                     HAS_BIAS: tl.constexpr):
        """Store `rows`' partial (a split), or, in the program that finishes the column block (`last`), sum the
        splits' partials, add the bias and write the output in its dtype."""
        ok = (rows < M)[:, None] & col_ok[None, :]
        tile = rows[:, None] * N + cols[None, :]
        if SPLIT_K > 1:
            if last:
                acc = tl.zeros(acc.shape, tl.float32)
                for s in range(SPLIT_K):  # .cg: read from L2, past this SM's L1
                    acc += tl.load(PART + s * M * N + tile, mask=ok, other=0.0, cache_modifier=".cg")
            else:
                tl.store(PART + pid_k * M * N + tile, acc, mask=ok)
        if last:
            if HAS_BIAS:
                acc += tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            tl.store(Y + rows[:, None] * sy + cols[None, :], acc.to(Y.dtype.element_ty), mask=ok)

    @triton.autotune(
        configs=[triton.Config({"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split}, num_warps=w, num_stages=s)
                 for bn, bk, w, s in BLOCKS for split in SPLITS],
        key=["M_BLOCK", "N", "K", "SM", "GATED"],  # SM: the splits allowed, and the workspace sized for them, depend on it
        prune_configs_by={"early_config_prune": _worth_timing},
    )
    @triton.jit
    def _skinny(X, W, B, Y, PART, COUNT, M, N, K, sx, sw, sy, SM, SPLIT_K,
                HAS_BIAS: tl.constexpr, GATED: tl.constexpr, M_BLOCK: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        wait_then_release(PDL)
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rows = tl.arange(0, M_BLOCK)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
        k_lo = pid_k * per_split
        acc = tl.zeros([M_BLOCK, BLOCK_N], tl.float32)
        for k0 in range(k_lo, tl.minimum(k_lo + per_split, K), BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            w = tl.load(W + cols[:, None] * sw + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            acc = _tile_rows(acc, X, w, rows, ks, k_ok, M, sx, GATED, K)
        # SPLIT_K is a runtime argument (Triton folds a 1 into the kernel): `arrived` has one type on both branches
        arrived = SPLIT_K - 1
        if SPLIT_K > 1:
            _finish_rows(acc, B, Y, PART, rows, cols, col_ok, M, N, sy, pid_k, False, SPLIT_K, HAS_BIAS)
            tl.debug_barrier()  # every thread's partial is stored before the program counts itself in
            # release: this split's partial is visible before its count; acquire: the last one sees every partial
            arrived = tl.atomic_add(COUNT + pid_n, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:  # the last split to arrive (or the only one) writes the output
            _finish_rows(acc, B, Y, PART, rows, cols, col_ok, M, N, sy, pid_k, True, SPLIT_K, HAS_BIAS)
            if SPLIT_K > 1:
                tl.store(COUNT + pid_n, 0)  # every split has counted itself in: zero for the next call


_COUNTERS: dict[int, torch.Tensor] = {}


def split_counters(device: torch.device) -> torch.Tensor:
    """The device's split counters, zero between calls: one per column block of any N that may split (at
    most SPLIT_BELOW * sm / MIN_BLOCK_N), made once, outside any graph capture, so captured graphs and eager
    calls share them. Made inside a capture (no eager call came first), they are that call's own, zeroed by
    a memset the graph replays."""
    dev = device.index if device.index is not None else torch.cuda.current_device()
    if dev in _COUNTERS:
        return _COUNTERS[dev]
    counters = torch.zeros(SPLIT_BELOW * sm_count(device) // MIN_BLOCK_N, device=device, dtype=torch.int32)
    if not torch.cuda.is_current_stream_capturing():  # a capture's own stay out of the cache: its pool holds them
        _COUNTERS[dev] = counters
    return counters


def launch(kernel, x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gated: bool = False,
           **config) -> torch.Tensor:
    """`kernel` (the autotuned `_skinny`, or its plain `.fn` with a `config` spelled out, as the tests run
    every config) on x2 [rows, K] ([1, 2K] gated): the output, the split partials' workspace and the
    device's counters."""
    n, k = weight.shape
    rows = x2.shape[0]
    if x2.shape[1] != (2 * k if gated else k):
        raise ValueError(f"skinny GEMM: input of {x2.shape[1]} columns for a weight of {k}{' (gated: 2x)' if gated else ''}")
    if gated and rows != 1:
        raise ValueError(f"skinny GEMM: a gated input has one row, not {rows}")
    sm = sm_count(x2.device)
    splits = max_split(n, sm)
    y = torch.empty(rows, n, device=x2.device, dtype=x2.dtype)
    part, count = y, y  # unused when no config may split (N >= SPLIT_BELOW per SM): no workspace
    if splits > 1:
        part = torch.empty(splits, rows, n, device=x2.device, dtype=torch.float32)
        count = split_counters(x2.device)

    def grid(meta):
        return (triton.cdiv(n, meta["BLOCK_N"]), meta["SPLIT_K"])

    kernel[grid](x2, weight, bias if bias is not None else weight, y, part, count, rows, n, k, x2.stride(0),
                 weight.stride(0), y.stride(0), sm, HAS_BIAS=bias is not None, GATED=gated,
                 M_BLOCK=max(16, triton.next_power_of_2(rows)), **pdl.options(x2), **config)
    return y


def applies(x: torch.Tensor, rows: int, gated: bool = False) -> bool:
    """Whether the kernel runs x of `rows` rows: bf16/fp16 on CUDA, at most MAX_ROWS rows (one, gated)."""
    return (triton is not None and x.is_cuda and rows <= (1 if gated else MAX_ROWS)
            and x.dtype in (torch.bfloat16, torch.float16))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, gated: bool = False) -> torch.Tensor:
    """`linear_reference` for x with at most MAX_ROWS rows (any leading shape), bf16/fp16 on CUDA; else the
    reference itself."""
    rows = x.numel() // x.shape[-1]
    if not applies(x, rows, gated):
        return linear_reference(x, weight, bias, gated)
    x2 = x.reshape(rows, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return launch(_skinny, x2, weight, bias, gated).reshape(*x.shape[:-1], weight.shape[0])
