"""A tree step's GEMMs at 64 and 65 rows (63 and 64 nodes with the root) at the 7B shape: cuBLAS against every
configuration of our skinny GEMM and of experimental variants, each timed as a step's graph runs it.

`PYTHONPATH=. python3 benchmarks/gemm_rows_sweep.py [--shape llama2-7b] [--rows 64,65] [--matrices qkv,o,gate_up,down]`
(CUDA). Issue 27 asks the 7B 64-node step to cost at most 1.15x the AR step. The step's GEMMs run at 65 rows,
past the skinny kernel's 64, so cuBLAS runs them: inside the step they took 16.2 µs (o), 41.9 (down), 36.1 (qkv,
and a 3.1 µs split-K reduce) and 68.8 (gate_up) a layer (the cuBLAS row of gemm_pdl_prefetch_7b_h100_2026-12-07.jsonl,
one H100), where reading each weight at 3,023 GB/s (copy bandwidth, 2026-12-07) takes 11.1, 29.8, 33.3 and 59.7.
Here every configuration is timed over >= 256 MB of weight copies (`gemm_choice.past_l2`), back to back in one
replayed graph (`cudagraph.graphed_us`), as in a step.

Variants (`_rows`, here only until one earns its place in engine/kernels/gemv.py):
  - SWAP: the weight tile is the dot's left operand (out^T = W x^T), as cuBLAS's TNT kernels run it;
  - EXTRA: 65 rows as a 64-row tile plus one row done by FMA on the weight tile already loaded, instead of a
    128-row tile (half of it dead) or a second read of the weight;
  - TMA: the tiles load through tensor descriptors (Hopper's TMA), not per-thread loads.
Each line printed is one JSON object: matrix, rows, kernel, configuration, µs per call, the fraction of copy
bandwidth its weight read reaches, the error against float64, and `wrong` where that error is over WRONG (bf16
GEMMs of these shapes give 1.7e-3; in the run of 2026-12-07, 41 of `_rows`'s 308 per-thread-load configurations at
65 rows gave 2.4e-3 to 3.5e-2 on the GPU, and were exact under Triton's interpreter: a miscompile, not looked into).
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from engine.bench.common import copy_bandwidth
from engine.bench.step import SHAPES
from engine.cudagraph import graphed_us
from engine.gemm_choice import past_l2
from engine.kernels import gemv

WRONG = 4e-3  # relative error (Frobenius, against float64) past which a result is marked wrong


@triton.jit
def _rows(X, W, Y, PART, COUNT, M, N, K, sx, sw, sy, SPLIT_K,
          M_BLOCK: tl.constexpr, EXTRA: tl.constexpr, SWAP: tl.constexpr, TMA: tl.constexpr,
          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (column block, K split): rows 0..M_BLOCK-1 by one dot per K tile, and with EXTRA row M_BLOCK by
    FMA on the same weight tile; splits meet as in gemv._skinny (partials, the last arrival sums them)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = tl.arange(0, M_BLOCK)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_lo = pid_k * per_split
    k_hi = tl.minimum(k_lo + per_split, K)
    if TMA:
        w_desc = tl.make_tensor_descriptor(W, shape=[N, K], strides=[sw, 1], block_shape=[BLOCK_N, BLOCK_K])
        x_desc = tl.make_tensor_descriptor(X, shape=[tl.minimum(M, M_BLOCK), K], strides=[sx, 1],
                                           block_shape=[M_BLOCK, BLOCK_K])
    if SWAP:
        acc = tl.zeros([BLOCK_N, M_BLOCK], tl.float32)
    else:
        acc = tl.zeros([M_BLOCK, BLOCK_N], tl.float32)
    extra = tl.zeros([BLOCK_N], tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        if TMA:
            w = w_desc.load([pid_n * BLOCK_N, k0])
            x = x_desc.load([0, k0])
        else:
            w = tl.load(W + cols[:, None] * sw + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            x = tl.load(X + rows[:, None] * sx + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        if SWAP:
            acc = tl.dot(w, tl.trans(x), acc)
        else:
            acc = tl.dot(x, tl.trans(w), acc)
        if EXTRA:
            xe = tl.load(X + M_BLOCK * sx + ks, mask=k_ok, other=0.0).to(tl.float32)
            extra += tl.sum(w.to(tl.float32) * xe[None, :], 1)
    if SWAP:
        acc = tl.trans(acc)
    ok = row_ok[:, None] & col_ok[None, :]
    tile = rows[:, None] * N + cols[None, :]
    arrived = SPLIT_K - 1
    if SPLIT_K > 1:
        tl.store(PART + pid_k * M * N + tile, acc, mask=ok)
        if EXTRA:
            tl.store(PART + pid_k * M * N + M_BLOCK * N + cols, extra, mask=col_ok)
        tl.debug_barrier()
        arrived = tl.atomic_add(COUNT + pid_n, 1, sem="acq_rel")
    if arrived == SPLIT_K - 1:
        if SPLIT_K > 1:
            acc = tl.zeros([M_BLOCK, BLOCK_N], tl.float32)
            extra = tl.zeros([BLOCK_N], tl.float32)
            for s in range(SPLIT_K):
                acc += tl.load(PART + s * M * N + tile, mask=ok, other=0.0, cache_modifier=".cg")
                if EXTRA:
                    extra += tl.load(PART + s * M * N + M_BLOCK * N + cols, mask=col_ok, other=0.0, cache_modifier=".cg")
            tl.store(COUNT + pid_n, 0)
        tl.store(Y + rows[:, None] * sy + cols[None, :], acc.to(Y.dtype.element_ty), mask=ok)
        if EXTRA:
            tl.store(Y + M_BLOCK * sy + cols, extra.to(Y.dtype.element_ty), mask=col_ok)


def rows_launch(x: torch.Tensor, w: torch.Tensor, block_n: int, block_k: int, split: int, warps: int, stages: int,
                swap: bool, tma: bool) -> torch.Tensor:
    """`_rows` on x [M, K] (M <= 128): a 64-row tile plus the FMA row at 65 rows, else the power-of-two tile.
    Split counters: the device's (gemv.split_counters), whose count covers these column blocks."""
    m, k = x.shape
    n = w.shape[0]
    extra = m == 65
    m_block = 64 if extra else max(16, triton.next_power_of_2(m))
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    part = torch.empty(split, m, n, device=x.device, dtype=torch.float32) if split > 1 else y
    count = gemv.split_counters(x.device)
    _rows[(triton.cdiv(n, block_n), split)](x, w, y, part, count, m, n, k, x.stride(0), w.stride(0), y.stride(0), split,
                                            M_BLOCK=m_block, EXTRA=extra, SWAP=swap, TMA=tma, BLOCK_N=block_n,
                                            BLOCK_K=block_k, num_warps=warps, num_stages=stages)
    return y


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama2-7b")
    ap.add_argument("--rows", default="64,65")
    ap.add_argument("--matrices", default="qkv,o,gate_up,down")
    ap.add_argument("--variants", default="skinny,rows",
                    help="skinny: gemv._skinny's configs; rows: _rows's with per-thread loads; tma: _rows's with TMA")
    args = ap.parse_args()
    triton.set_allocator(lambda size, align, stream: torch.empty(size, device="cuda", dtype=torch.int8))
    cfg = SHAPES[args.shape]
    d, f = cfg["hidden_size"], cfg["intermediate_size"]
    kv = cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * (d // cfg["num_attention_heads"])
    shapes = {"qkv": (d + 2 * kv, d), "o": (d, d), "gate_up": (2 * f, d), "down": (d, f)}
    bw = copy_bandwidth()
    sm = gemv.sm_count(torch.device("cuda"))
    print(json.dumps({"device": torch.cuda.get_device_name(), "copy_gb_s": round(bw / 1e9, 1), "sm": sm}), flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name in args.matrices.split(","):
        n, k = shapes[name]
        w = (torch.randn(n, k, device="cuda", generator=gen) / k ** 0.5).to(torch.bfloat16)
        copies = past_l2([(w, None)])
        nbytes = n * k * 2
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
            ref = F.linear(x.double(), w.double())

            def record(kernel: str, config, call, copies=copies) -> None:
                try:
                    err = ((call(w).double() - ref).norm() / ref.norm()).item()
                    us = graphed_us(lambda c: call(c[0]), copies)
                except Exception as e:  # a configuration that cannot compile or launch here: say so, go on
                    print(json.dumps({"matrix": name, "rows": m, "kernel": kernel, "config": config,
                                      "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}), flush=True)
                    return
                print(json.dumps({"matrix": name, "N": n, "K": k, "rows": m, "kernel": kernel, "config": config,
                                  "us": round(us, 2), "of_copy_bw": round(nbytes / (us * 1e-6) / bw, 3),
                                  "rel_err": float(f"{err:.1e}"), **({"wrong": True} if err > WRONG else {})}),
                      flush=True)

            record("cublas", None, lambda wt: F.linear(x, wt))
            if "skinny" in args.variants:
                m_block = max(16, triton.next_power_of_2(m))
                for c in gemv._worth_timing(gemv._skinny.configs, {"N": n, "SM": sm}, M_BLOCK=m_block, GATED=False):
                    kw = c.all_kwargs()
                    record("skinny", kw, lambda wt, kw=kw: gemv.launch(gemv._skinny.fn, x, wt, None, **kw))
            tmas = [tma for tma, name in ((False, "rows"), (True, "tma")) if name in args.variants.split(",")]
            if tmas:
                blocks = ((64, 128, 4, 4), (128, 64, 4, 4), (128, 128, 8, 3), (64, 64, 4, 6), (128, 64, 8, 5))
                for (bn, bk, warps, stages), swap, tma in itertools.product(blocks, (False, True), tmas):
                    for split in (s for s in (1, 2, 3, 4, 8) if triton.cdiv(n, bn) * s <= 4 * sm):
                        kw = dict(block_n=bn, block_k=bk, split=split, warps=warps, stages=stages, swap=swap, tma=tma)
                        record("rows", kw, lambda wt, kw=kw: rows_launch(x, wt, **kw))
        del copies


if __name__ == "__main__":
    main()
