"""Rotary embeddings and the KV-cache write: the torch reference, and one Triton kernel for both.

Eagerly, a layer's q/k/v split, two RoPE applications (seven kernels each), two transposes and two
indexed cache writes are ~20 launches. The kernel reads the stacked q/k/v projection once and
writes rotated q to its own tensor, rotated k and plain v straight into the cache slots
start[b] + t of their request; the angles come from the positions and inverse frequencies inside
the kernel. It rounds where the reference rounds (cos/sin cast to the model dtype, each product
rounded, then their sum), so the two agree to the last bit but for fp32 reduction order.
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


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype):
    """positions [B, T] -> cos, sin [B, 1, T, D] in the model dtype (angles in float32)."""
    angles = positions.float()[..., None] * inv_freq
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def rope_reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """q [B, Hq, T, D], k [B, Hkv, T, D] rotated by position (transformers' rotate_half form)."""
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def write_cache_reference(cache_k: torch.Tensor, cache_v: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          start: torch.Tensor) -> None:
    """cache_* [B_cap, Hkv, S, D] of one layer; k, v [B, Hkv, T, D] go to slots start[b] .. start[b]+T-1."""
    b, _, t, _ = k.shape
    rows = torch.arange(b, device=k.device)[:, None]
    slots = start[:, None] + torch.arange(t, device=k.device)
    cache_k[rows, :, slots] = k.transpose(1, 2)
    cache_v[rows, :, slots] = v.transpose(1, 2)


if triton is not None:

    @triton.jit
    def _rope_qkv_to_cache(
        QKV, Pos, InvFreq, QOut, K, V, Starts,
        T, HQ, HKV, sx_b, sx_t, sq_b, sq_h, sq_t, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s,
        D: tl.constexpr, HALF: tl.constexpr, PDL: tl.constexpr,
    ):
        wait_then_release(PDL)
        bt = tl.program_id(0)  # (request, block token)
        head = tl.program_id(1)  # HQ query heads, then HKV key heads, then HKV value heads
        b = bt // T
        t = bt % T
        j = tl.arange(0, HALF)
        src = QKV + b * sx_b + t * sx_t + head * D
        x1 = tl.load(src + j)
        x2 = tl.load(src + HALF + j)
        if head >= HQ + HKV:  # value: copied as is
            slot = tl.load(Starts + b) + t
            dst = V + b * sv_b + (head - HQ - HKV) * sv_h + slot * sv_s
            tl.store(dst + j, x1)
            tl.store(dst + HALF + j, x2)
        else:
            pos = tl.load(Pos + b * T + t).to(tl.float32)
            angle = pos * tl.load(InvFreq + j)
            c = tl.cos(angle).to(x1.dtype).to(tl.float32)
            s = tl.sin(angle).to(x1.dtype).to(tl.float32)
            a1 = x1.to(tl.float32)
            a2 = x2.to(tl.float32)
            o1 = (a1 * c).to(x1.dtype).to(tl.float32) + (-a2 * s).to(x1.dtype).to(tl.float32)
            o2 = (a2 * c).to(x1.dtype).to(tl.float32) + (a1 * s).to(x1.dtype).to(tl.float32)
            if head < HQ:
                dst = QOut + b * sq_b + head * sq_h + t * sq_t
            else:
                slot = tl.load(Starts + b) + t
                dst = K + b * sk_b + (head - HQ) * sk_h + slot * sk_s
            tl.store(dst + j, o1.to(x1.dtype))
            tl.store(dst + HALF + j, o2.to(x1.dtype))


def rope_qkv_to_cache(qkv: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, cache_k: torch.Tensor,
                      cache_v: torch.Tensor, start: torch.Tensor, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """qkv [B, T, (Hq + 2 Hkv) * D] (the stacked projection), positions [B, T], start [B] -> rotated q
    [B, Hq, T, D]; rotated k and v land in cache_k/cache_v [B_cap, Hkv, S, D] at slots start[b] + t."""
    b, t, width = qkv.shape
    d = width // (n_heads + 2 * n_kv_heads)
    if qkv.stride(-1) != 1 or cache_k.stride(-1) != 1 or cache_v.stride(-1) != 1:
        raise ValueError("rope_qkv_to_cache needs the head dim contiguous")
    q = torch.empty(b, n_heads, t, d, device=qkv.device, dtype=qkv.dtype)
    positions = positions.expand(b, t).contiguous()
    _rope_qkv_to_cache[(b * t, n_heads + 2 * n_kv_heads)](
        qkv, positions, inv_freq, q, cache_k, cache_v, start,
        t, n_heads, n_kv_heads, qkv.stride(0), qkv.stride(1), q.stride(0), q.stride(1), q.stride(2),
        cache_k.stride(0), cache_k.stride(1), cache_k.stride(2), cache_v.stride(0), cache_v.stride(1), cache_v.stride(2),
        D=d, HALF=d // 2, **pdl.options(q),
    )
    return q
