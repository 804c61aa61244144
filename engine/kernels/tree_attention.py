"""Tree-masked split-KV flash-decoding: a Triton kernel and, first, the torch reference it must equal.

The function (docs/attention.md): q [B, Hq, T, D] are a block of T new tokens (a tree, or a causal
block); k, v [B, Hkv, S, D] hold each request's committed prefix in slots [0, start[b]) and the block
itself in [start[b], start[b] + T). Query i of request b sees every prefix slot and the block slots
j with block_mask[i, j]; nothing else (later slots hold another request's longer prefix, or stale
tree nodes). GQA: query head h reads KV head h // (Hq / Hkv).

The kernel. One program per (request x KV head, block of packed query rows, KV split). The rows of
a KV head are all G query heads x T block tokens packed into one tile, so the prefix's K/V are
streamed once per row block with no mask beyond the live length. The last split is the T x T block
itself, masked by a per-row ancestor bitmask (int64 words: bit j of word w of row i says whether
block token 64w+j is visible to token i). Each split writes a partial output and its log-sum-exp;
one merge launch combines them into the output layout. Lengths are read from a device tensor, and
each program decides from its own request's live length how many splits carry work (each at least
MIN_SPLIT keys), so one launch shape, captured in a CUDA graph at the cache's capacity, does work
proportional to the live prefix, not to the capacity.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the reference below still works
    triton = None

from . import pdl

if triton is not None:
    from .pdl import wait_then_release

BLOCK_N = 64  # keys per inner iteration of the merge's split arithmetic (the split kernel tunes its own)
MIN_SPLIT = 256  # fewest prefix keys worth a split of their own
ROW_CAP = 64  # most packed query rows in a bf16/fp16 tile (block_rows)
# a launch provides for SPLIT_FILL x the SM count programs at full capacity: 2 measured 8 % faster
# (geometric mean over T 1-64, L 1k-32k, MHA and GQA) than 4 or 8, whose extra splits cost more in
# partial outputs written and merged than they gain in parallelism (benchmarks/attn_split_sweep.py)
SPLIT_FILL = 2
# One query token per request (an AR step) in bf16/fp16, head size up to 128, takes this configuration rather
# than the autotuner's. The autotuner times its candidates alone with K/V hot in L2, and at T = 1 it chose 128 keys
# / 8 warps in some processes and 64 keys / 4 warps / 3 stages in others. At the small shapes every graphed AR step
# measured was faster with the latter (one H100: the demo's split kernel 23.7 against 28.1 µs a step and SmolLM2's
# 148 against 173 µs, 2026-12-07; forced alone, the demo's AR step 0.159 against the autotuned 0.165 ms and
# SmolLM2's 1.027 against 1.047 ms, 2026-12-06); at the 7B shape the autotuner chose it itself.
DECODE_CONFIG = dict(BLOCK_N=64, num_warps=4, num_stages=3)


# -- reference ------------------------------------------------------------------------------------
def reference_mask(start: int | torch.Tensor, block_mask: torch.Tensor | None, t: int, span: int,
                   groups: int = 1, device: torch.device | str | None = None) -> torch.Tensor:
    """The boolean mask of the function above, for SDPA: [B, 1, groups*T, span] for per-request starts
    [B], or [groups*T, start+T] for one int start (rows repeated per query head of a GQA group)."""
    if isinstance(start, int):
        dev = device or (block_mask.device if block_mask is not None else "cpu")
        block = block_mask.to(torch.bool) if block_mask is not None else torch.ones(t, t, dtype=torch.bool).tril()
        mask = torch.cat((torch.ones(t, start, dtype=torch.bool, device=dev), block.to(dev)), dim=1)
        return mask.repeat(groups, 1) if groups > 1 else mask
    dev = start.device
    block = block_mask.to(dev, torch.bool) if block_mask is not None else torch.ones(t, t, dtype=torch.bool, device=dev).tril()
    rel = torch.arange(span, device=dev)[None, :] - start[:, None]  # [B, span]: slot offset into the block
    in_block = (rel >= 0) & (rel < t)
    tree = block[:, rel.clamp(0, t - 1)].transpose(0, 1)  # [B, T, span]
    mask = (rel < 0)[:, None, :] | (in_block[:, None, :] & tree)
    return (mask.repeat(1, groups, 1) if groups > 1 else mask)[:, None]


def tree_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int | torch.Tensor,
                             block_mask: torch.Tensor | None, mask: torch.Tensor | None = None) -> torch.Tensor:
    """SDPA with the dense mask (`mask`: reference_mask(...) built once by the caller for all layers).
    With an int start, k/v may be longer than start + T (the rest is ignored)."""
    b, hq, t, d = q.shape
    hkv = k.shape[1]
    if isinstance(start, int):
        k, v = k[:, :, : start + t], v[:, :, : start + t]
        if hq == hkv and block_mask is None and start == 0:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if mask is None:
        mask = reference_mask(start, block_mask, t, k.shape[2], hq // hkv, q.device)
    if hq == hkv:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    # GQA without copying K/V: the G query heads of a KV head become G*T rows of one query block
    g = hq // hkv
    out = F.scaled_dot_product_attention(q.reshape(b, hkv, g * t, d), k, v, attn_mask=mask)
    return out.reshape(b, hq, t, d)


# -- kernel ---------------------------------------------------------------------------------------
if triton is not None:

    @triton.jit
    def _live_splits(start, n_splits, MIN_SPLIT: tl.constexpr, BLOCK_N: tl.constexpr):
        """(splits with work, keys per split) for a prefix of `start` keys: identical in both kernels."""
        n_live = tl.maximum(tl.minimum(n_splits, tl.cdiv(start, MIN_SPLIT)), 1)
        chunk = tl.cdiv(tl.cdiv(tl.maximum(start, 1), n_live), BLOCK_N) * BLOCK_N
        return n_live, chunk

    @triton.autotune(  # tuned once per tile shape, in the eager warm-up steps before any graph capture
        configs=[triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=s)
                 for bn, w, s in ((64, 4, 2), (64, 4, 3), (64, 8, 3), (128, 4, 2), (128, 8, 2), (128, 8, 3))],
        key=["BLOCK_M", "D", "IEEE"],
    )
    @triton.jit
    def _tree_attn_split(
        Q, K, V, MB, PO, PL, Starts,
        sqb, sqh, sqt, skb, skh, sks, svb, svh, svs,
        n_kv_heads, T, G, W, n_splits, sm_scale,
        BLOCK_M: tl.constexpr, D: tl.constexpr, IEEE: tl.constexpr, MIN_SPLIT: tl.constexpr, BLOCK_N: tl.constexpr,
        PDL: tl.constexpr,
    ):
        wait_then_release(PDL)
        pid_bh = tl.program_id(0)
        pid_m = tl.program_id(1)
        pid_s = tl.program_id(2)
        b = pid_bh // n_kv_heads
        kvh = pid_bh % n_kv_heads
        start = tl.load(Starts + b).to(tl.int32)
        n_live, chunk = _live_splits(start, n_splits, MIN_SPLIT, BLOCK_N)
        is_tree = pid_s == n_splits
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        n_rows = G * T
        row_ok = rows < n_rows
        base = (pid_bh * (n_splits + 1) + pid_s) * n_rows
        d = tl.arange(0, D)
        active = is_tree | (pid_s < n_live)  # splits past the live prefix do nothing; the merge skips them
        qh = kvh * G + rows // T
        t = rows % T
        q = tl.load(Q + b * sqb + qh[:, None] * sqh + t[:, None] * sqt + d[None, :], mask=row_ok[:, None] & active,
                    other=0.0)
        lo = tl.where(is_tree, start, pid_s * chunk)
        hi = tl.where(is_tree, start + T, tl.where(active, tl.minimum(pid_s * chunk + chunk, start), lo))
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
        tl.store(PO + (base + rows)[:, None] * D + d[None, :], out, mask=row_ok[:, None] & active)
        tl.store(PL + base + rows, lse, mask=row_ok)

    @triton.jit
    def _merge_splits(
        PO, PL, Out, Starts, so_b, so_h, so_t,
        n_kv_heads, T, G, n_splits,
        BLOCK_R: tl.constexpr, D: tl.constexpr, MIN_SPLIT: tl.constexpr, BLOCK_N: tl.constexpr,
        PDL: tl.constexpr,
    ):
        """One program per (request x KV head, block of rows): softmax-weighted sum of the splits
        with work and the tree split, written straight into Out [B, Hq, T, D] in its dtype."""
        wait_then_release(PDL)
        pid_bh = tl.program_id(0)
        rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
        n_rows = G * T
        row_ok = rows < n_rows
        b = pid_bh // n_kv_heads
        kvh = pid_bh % n_kv_heads
        start = tl.load(Starts + b).to(tl.int32)
        n_live, chunk = _live_splits(start, n_splits, MIN_SPLIT, BLOCK_N)
        d = tl.arange(0, D)
        first = pid_bh * (n_splits + 1) * n_rows
        tree = first + n_splits * n_rows
        m = tl.load(PL + tree + rows, mask=row_ok, other=float("-inf"))
        for s in range(0, n_live):
            m = tl.maximum(m, tl.load(PL + first + s * n_rows + rows, mask=row_ok, other=float("-inf")))
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        w = tl.exp(tl.load(PL + tree + rows, mask=row_ok, other=float("-inf")) - m_safe)
        total = w
        acc = w[:, None] * tl.load(PO + (tree + rows)[:, None] * D + d[None, :], mask=row_ok[:, None] & (w[:, None] > 0),
                                   other=0.0)
        for s in range(0, n_live):
            off = first + s * n_rows
            w = tl.exp(tl.load(PL + off + rows, mask=row_ok, other=float("-inf")) - m_safe)
            total += w
            acc += w[:, None] * tl.load(PO + (off + rows)[:, None] * D + d[None, :], mask=row_ok[:, None] & (w[:, None] > 0),
                                        other=0.0)
        out = acc / tl.where(total > 0, total, 1.0)[:, None]
        qh = kvh * G + rows // T
        t = rows % T
        tl.store(Out + b * so_b + qh[:, None] * so_h + t[:, None] * so_t + d[None, :], out.to(Out.dtype.element_ty),
                 mask=row_ok[:, None])


_SM_COUNT: dict[int, int] = {}


def _sm_count(device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def block_rows(rows: int, dtype: torch.dtype) -> int:
    """Packed query rows per tile. Exact fp32 dots (the dtype the lossless tests use) run on FMA units,
    so their tiles stay at 16 rows (a 12-node fp32 demo tree step: 2.1 ms with 64-row tiles, 0.9 ms
    with 16). bf16/fp16 tiles grow to ROW_CAP rows: with 64 against 128, a 65-token tree step (64
    nodes and the root) got 3-5 % faster at the 7B, 8B, SmolLM2 and demo shapes and no step got
    slower by more than 0.13 % (one H100, `benchmarks/attn_step_sweep.py`, benchmarks/README.md "Row
    tiles of 64"). Why was not isolated: both tiles of a 65-row block compute 63 dead rows, but a
    128-row tile holds twice the accumulator (128 x 128 fp32 at D 128) and 64-row tiles make twice
    the programs."""
    if dtype == torch.float32:
        return 16
    return max(16, min(ROW_CAP, triton.next_power_of_2(rows)))


def split_count(batch: int, kv_heads: int, m_blocks: int, capacity: int, device) -> int:
    """Prefix splits a launch provides for: enough programs to fill the GPU about SPLIT_FILL times over
    at full capacity; each program then uses only the splits its live length needs (`_live_splits`)."""
    programs = batch * kv_heads * m_blocks
    want = max(1, (SPLIT_FILL * _sm_count(device)) // max(programs, 1))
    return max(1, min(triton.cdiv(max(capacity, 1), MIN_SPLIT), want))


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int | torch.Tensor,
                   block_mask: torch.Tensor | None = None, tree_bits: torch.Tensor | None = None) -> torch.Tensor:
    """`tree_attention_reference` on CUDA: q [B, Hq, T, D], k/v [B, Hkv, S, D]; start an int or a [B]
    device tensor (then S bounds the longest request). `tree_bits` [T, W] int64 (trees.pack_mask_bits)
    may replace block_mask, and must inside a CUDA graph (no host-to-device copy there)."""
    if triton is None:
        raise RuntimeError("the triton attention backend needs Triton (pip install triton) and a CUDA device")
    b, hq, t, d = q.shape
    hkv = k.shape[1]
    if isinstance(start, torch.Tensor):
        starts, capacity = start, k.shape[2] - t
    else:
        starts, capacity = torch.full((b,), start, device=q.device, dtype=torch.int32), start
    if tree_bits is None:
        from trees import pack_mask_bits

        block = block_mask if block_mask is not None else torch.ones(t, t, dtype=torch.bool).tril()
        tree_bits = pack_mask_bits(block.cpu()).to(q.device)
    g = hq // hkv
    rows = g * t
    ieee = q.dtype == torch.float32
    block_m = block_rows(rows, q.dtype)
    m_blocks = triton.cdiv(rows, block_m)
    n_splits = split_count(b, hkv, m_blocks, capacity, q.device)
    po = torch.empty(b * hkv, n_splits + 1, rows, d, device=q.device, dtype=torch.float32)
    pl = torch.empty(b * hkv, n_splits + 1, rows, device=q.device, dtype=torch.float32)
    # the fixed configuration needs 22 KB of shared memory at D 128 compiled for sm_90 (40 KB for sm_80): any GPU
    decode = t == 1 and not ieee and d <= 128
    kernel, config = (_tree_attn_split.fn, DECODE_CONFIG) if decode else (_tree_attn_split, {})
    kernel[(b * hkv, m_blocks, n_splits + 1)](
        q, k, v, tree_bits, po, pl, starts,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        hkv, t, g, tree_bits.shape[1], n_splits, 1.0 / math.sqrt(d),
        BLOCK_M=block_m, D=d, IEEE=ieee, MIN_SPLIT=MIN_SPLIT, **pdl.options(q), **config,
    )
    # [B, T, Hq, D] in memory, seen as [B, Hq, T, D]: the caller's transpose + reshape to [B, T, Hq*D] is free
    out = torch.empty(b, t, hq, d, device=q.device, dtype=q.dtype).transpose(1, 2)
    block_r = 16
    _merge_splits[(b * hkv, triton.cdiv(rows, block_r))](
        po, pl, out, starts, out.stride(0), out.stride(1), out.stride(2),
        hkv, t, g, n_splits, BLOCK_R=block_r, D=d, MIN_SPLIT=MIN_SPLIT, BLOCK_N=BLOCK_N, **pdl.options(q),
    )
    return out
