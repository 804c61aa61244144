"""KV compaction of the accepted tree path: the torch reference, and every layer in one Triton launch.

After a tree step the accepted nodes' K/V sit at scattered slots `start + node`; they move to
`start + 0..kept-1` (docs/algorithm.md). Sources and destinations overlap whenever the path goes
through a non-first child: on a path whose node at depth j is node 3j, slot 3 is row 1's source and
row 3's destination. So every source is read before any destination is written.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs use the reference
    triton = None

from . import pdl

if triton is not None:
    from .pdl import wait_then_release


def compact_reference(k: torch.Tensor, v: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """k, v [L, B_cap, H, S, D]; src, dst [B, n]: slot src[b, i] -> dst[b, i] of request b in every
    layer and head, as two gathers then two scatters. A row may repeat its last pair as padding."""
    rows = torch.arange(src.shape[0], device=src.device)[:, None]
    gathered_k, gathered_v = k[:, rows, :, src], v[:, rows, :, src]  # [B, n, L, H, D]
    k[:, rows, :, dst] = gathered_k
    v[:, rows, :, dst] = gathered_v


if triton is not None:

    @triton.jit
    def _compact(K, V, Src, Dst, B, H, n,
                 skl, skb, skh, sks, svl, svb, svh, svs,
                 BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, D: tl.constexpr, BARRIER: tl.constexpr, PDL: tl.constexpr):
        wait_then_release(PDL)
        pid = tl.program_id(0)  # (layer, request, head), head fastest
        h = pid % H
        b = (pid // H) % B
        layer = pid // (H * B)
        i = tl.arange(0, BLOCK_N)
        d = tl.arange(0, BLOCK_D)
        ok = i < n
        src = tl.load(Src + b * n + i, mask=ok, other=0)
        dst = tl.load(Dst + b * n + i, mask=ok, other=0)
        tile = ok[:, None] & (d[None, :] < D)
        k_base = K + layer * skl + b * skb + h * skh
        v_base = V + layer * svl + b * svb + h * svh
        k = tl.load(k_base + src[:, None] * sks + d[None, :], mask=tile)  # phase 1: every source row
        v = tl.load(v_base + src[:, None] * svs + d[None, :], mask=tile)
        # The tile's rows are spread over the program's warps, which run unordered: without this barrier
        # a warp could store slot j before another warp had loaded slot j as a source.
        if BARRIER:
            tl.debug_barrier()
        tl.store(k_base + dst[:, None] * sks + d[None, :], k, mask=tile)  # phase 2: every destination row
        tl.store(v_base + dst[:, None] * svs + d[None, :], v, mask=tile)


def compact(k: torch.Tensor, v: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, barrier: bool = True) -> None:
    """`compact_reference` in one launch, race-free by construction: one program per (layer, request,
    KV head) owns every slot its rows read or write (programs never share a slot); it loads all of its
    source rows into registers, waits at a block barrier (`bar.sync`: every load a thread issued before
    it has been performed, for every thread of the block, before any thread goes on), then stores them
    all. Indices are read on the device, so it runs inside a captured CUDA graph. CUDA tensors; the
    head dim contiguous. `barrier=False` builds the racy kernel, only for the stress test's control
    (tests/test_compact_stress_gpu.py): the race must show without the barrier, or the test is blind."""
    n_layers, _, heads, _, d = k.shape
    b, n = src.shape
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("compact needs K/V whose head dim is contiguous")
    src, dst = src.contiguous(), dst.contiguous()
    _compact[(n_layers * b * heads,)](
        k, v, src, dst, b, heads, n,
        k.stride(0), k.stride(1), k.stride(2), k.stride(3), v.stride(0), v.stride(1), v.stride(2), v.stride(3),
        BLOCK_N=max(16, triton.next_power_of_2(n)), BLOCK_D=triton.next_power_of_2(d), D=d, BARRIER=barrier,
        **pdl.options(k),
    )
