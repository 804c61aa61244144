"""The one attention entry point: every backend computes the same function.

q [B, Hq, T, D] are the block's queries; k, v [B, Hkv, S, D] hold the committed prefix in slots
[0, start) and the block itself in [start, start+T). Query i sees every prefix slot and the block
slots j where block_mask[i, j] (None = causal). Backends: `sdpa` (the reference, any device) and
`triton` (our tree-masked split-KV flash-decoding kernel, CUDA; engine/kernels/tree_attention.py).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

BACKENDS = ("sdpa", "triton")


@functools.lru_cache(maxsize=64)
def causal_bits(t: int, device: torch.device) -> torch.Tensor:
    """The causal [t, t] mask packed for the triton kernel, made once per (t, device): AR steps and
    prefill reuse it, and a captured CUDA graph never copies it from the host."""
    from trees import pack_mask_bits

    return pack_mask_bits(torch.ones(t, t, dtype=torch.bool).tril()).to(device)


def full_mask(start: int, block_mask: torch.Tensor | None, t: int, device, groups: int = 1) -> torch.Tensor:
    """[groups*T, start+T] bool: prefix all visible, then the block's own mask (rows repeated per
    query head of a GQA group)."""
    if block_mask is None:
        block_mask = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    prefix = torch.ones(t, start, dtype=torch.bool, device=device)
    mask = torch.cat((prefix, block_mask.to(device=device, dtype=torch.bool)), dim=1)
    return mask.repeat(groups, 1) if groups > 1 else mask


def batch_mask(starts: torch.Tensor, block_mask: torch.Tensor | None, t: int, span: int, groups: int = 1) -> torch.Tensor:
    """[B, 1, groups*T, span] bool for per-request lengths: request r's query i sees slots j < starts[r]
    and block slots starts[r] + m where block_mask[i, m]; every other slot (another request's
    longer prefix, stale tree nodes) is hidden."""
    dev = starts.device
    if block_mask is None:
        block_mask = torch.ones(t, t, dtype=torch.bool, device=dev).tril()
    rel = torch.arange(span, device=dev)[None, :] - starts[:, None]  # [B, span] slot offset into the block
    in_block = (rel >= 0) & (rel < t)
    tree = block_mask.to(dev)[:, rel.clamp(0, t - 1)].transpose(0, 1)  # [B, T, span]
    mask = (rel < 0)[:, None, :] | (in_block[:, None, :] & tree)
    if groups > 1:
        mask = mask.repeat(1, groups, 1)
    return mask[:, None]


def sdpa_attention(q, k, v, start: int, block_mask: torch.Tensor | None, mask: torch.Tensor | None = None):
    """mask: the [T, start+T] full mask when the caller built it once for all layers. With
    per-request `start` [B], k/v are already cut to the span and mask is `batch_mask(...)`."""
    b, hq, t, d = q.shape
    hkv = k.shape[1]
    if isinstance(start, torch.Tensor):
        if mask is None:
            mask = batch_mask(start, block_mask, t, k.shape[2], hq // hkv)
    else:
        k, v = k[:, :, : start + t], v[:, :, : start + t]
        if hq == hkv and block_mask is None and start == 0:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if mask is None:
            mask = full_mask(start, block_mask, t, q.device)
    if hq == hkv:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    # GQA without copying K/V: the G query heads of a KV head become G*T rows of one query block
    g = hq // hkv
    if mask.dim() == 2 and mask.shape[0] == t:  # one row per token: repeat it for each query head
        mask = mask.repeat(g, 1)
    out = F.scaled_dot_product_attention(q.reshape(b, hkv, g * t, d), k, v, attn_mask=mask)
    return out.reshape(b, hq, t, d)


def attention(q, k, v, start: int, block_mask: torch.Tensor | None, backend: str = "sdpa",
              dense_mask: torch.Tensor | None = None, fuse: bool = False) -> torch.Tensor:
    """dense_mask: what the backend precomputed once per forward (SDPA: the full bool mask;
    triton: the block's packed ancestor bits). fuse: merge the kernel's splits with a compiled op."""
    if backend == "sdpa":
        return sdpa_attention(q, k, v, start, block_mask, dense_mask)
    if backend == "triton":
        from .kernels.tree_attention import tree_attention

        return tree_attention(q, k, v, start, block_mask, mask_bits=dense_mask, fuse=fuse)
    raise ValueError(f"unknown attention backend {backend!r}; choose from {', '.join(BACKENDS)}")
