"""Tree-masked split-KV flash-decoding in Triton; `engine.attention.sdpa_attention` is its reference.

One program per (batch x KV head, block of packed query rows, KV split). The query rows of a KV
head are all G query heads x T tree tokens packed into one tile (GQA), so K/V of the committed
prefix are streamed once per row block with no mask beyond the live length. The last split is the
T x T tree block itself, masked by a per-row ancestor bitmask (int64 words: bit j of word w of row
i says whether block token 64w+j is visible to token i). Splits write partial outputs and their
log-sum-exp; a merge combines them. The split count follows the live prefix length, not the cache
capacity. Lengths are read per request from a device tensor, so requests of one batch may have
committed different numbers of tokens (each chunk is a share of its own request's length); the host
only picks the split count from an upper bound. T = 1 with an all-ones mask is plain decode attention.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .. import fused

BLOCK_N = 64
_SM_COUNT: dict[int, int] = {}


@triton.jit
def _tree_attn_split(
    Q, K, V, MB, PO, PL, Starts,
    sqb, sqh, sqt, skb, skh, sks, svb, svh, svs,
    n_kv_heads, T, G, W, n_splits, sm_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, IEEE: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    b = pid_bh // n_kv_heads
    kvh = pid_bh % n_kv_heads
    start = tl.load(Starts + b).to(tl.int32)
    chunk = tl.cdiv(tl.cdiv(tl.maximum(start, 1), n_splits), BLOCK_N) * BLOCK_N
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < G * T
    qh = kvh * G + rows // T
    t = rows % T
    d = tl.arange(0, D)
    q = tl.load(Q + b * sqb + qh[:, None] * sqh + t[:, None] * sqt + d[None, :], mask=row_ok[:, None], other=0.0)
    is_tree = pid_s == n_splits
    lo = tl.where(is_tree, start, pid_s * chunk)
    hi = tl.where(is_tree, start + T, tl.minimum(pid_s * chunk + chunk, start))
    m_i = tl.full([BLOCK_M], -1e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    k_base = K + b * skb + kvh * skh
    v_base = V + b * svb + kvh * svh
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        col_ok = cols < hi
        k = tl.load(k_base + cols[:, None] * sks + d[None, :], mask=col_ok[:, None], other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * sm_scale
        else:
            s = tl.dot(q, tl.trans(k)) * sm_scale
        ok = col_ok[None, :] & row_ok[:, None]
        if is_tree:
            j = cols - start
            word = tl.load(MB + t[:, None] * W + (j // 64)[None, :], mask=ok, other=0)
            ok = ok & (((word >> (j % 64)[None, :].to(tl.int64)) & 1) != 0)
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * svs + d[None, :], mask=col_ok[:, None], other=0.0)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    n_rows = G * T
    base = (pid_bh * (n_splits + 1) + pid_s) * n_rows
    tl.store(PO + (base + rows)[:, None] * D + d[None, :], out, mask=row_ok[:, None])
    tl.store(PL + base + rows, lse, mask=row_ok)


def _sm_count(device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def tree_attention(q, k, v, start, block_mask: torch.Tensor | None, mask_bits: torch.Tensor | None = None,
                   fuse: bool = False):
    """Same contract as `sdpa_attention`: q [B, Hq, T, D], k/v [B, Hkv, S, D] (prefix in [0, start),
    the block in [start, start+T)); start is an int or a [B] device tensor of per-request lengths (then
    k/v span the longest request). `mask_bits` [T, W] int64 may be given instead of block_mask."""
    b, hq, t, d = q.shape
    if isinstance(start, torch.Tensor):
        starts, start = start, k.shape[2] - t  # the split count follows the longest request
    else:
        starts = torch.full((b,), start, device=q.device, dtype=torch.int32)
    hkv = k.shape[1]
    g = hq // hkv
    if mask_bits is None:
        if block_mask is None:
            from ..attention import causal_bits

            mask_bits = causal_bits(t, q.device)
        else:
            from trees import pack_mask_bits

            mask_bits = pack_mask_bits(block_mask.cpu()).to(q.device)
    rows = g * t
    # exact fp32 dots (the dtype the lossless tests use) run on FMA units, not tensor cores, so their
    # tiles stay at 16 rows: a 12-node fp32 demo tree step (39 packed rows) took 2.1 ms with 64-row
    # tiles and 0.9 ms with 16-row ones (bench --part e2e, H200, graphs)
    ieee = q.dtype == torch.float32
    block_m = 16 if ieee else max(16, min(64, triton.next_power_of_2(rows)))
    m_blocks = triton.cdiv(rows, block_m)
    programs = b * hkv * m_blocks
    want = max(1, (4 * _sm_count(q.device)) // max(programs, 1))
    n_splits = max(1, min(triton.cdiv(start, BLOCK_N), want)) if start > 0 else 1
    po = torch.empty(b * hkv, n_splits + 1, rows, d, device=q.device, dtype=torch.float32)
    pl = torch.empty(b * hkv, n_splits + 1, rows, device=q.device, dtype=torch.float32)
    _tree_attn_split[(b * hkv, m_blocks, n_splits + 1)](
        q, k, v, mask_bits, po, pl, starts,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        hkv, t, g, mask_bits.shape[1], n_splits, 1.0 / math.sqrt(d),
        BLOCK_M=block_m, BLOCK_N=BLOCK_N, D=d, IEEE=ieee,
    )
    out = fused.op("merge_splits", fuse)(po, pl, q.dtype)  # [B*Hkv, G*T, D]
    return out.view(b, hkv, g, t, d).reshape(b, hq, t, d)
