"""The one attention entry point: every backend computes the same function (docs/attention.md).

A forward builds one `AttentionContext` (per-request starts, the slots read, and the mask in the
form its backend wants), and every layer calls `attention(q, k, v, ctx)` with it. Backends:
  sdpa    the reference, any device: `kernels.tree_attention.tree_attention_reference`
  triton  our tree-masked split-KV flash-decoding kernel (CUDA): `kernels.tree_attention.tree_attention`
  flash_attn  FlashAttention-4 with the tree as a mask_mod (CUDA, bf16/fp16, where importable):
          `kernels.flash4.flash4_attention`
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .kernels import flash4
from .kernels.tree_attention import reference_mask, tree_attention, tree_attention_reference

BACKENDS = ("sdpa", "triton", "flash_attn")
# backends whose kernels stop at each request's live length (read on the device); sdpa reads every slot given
READS_LIVE_LENGTH = ("triton", "flash_attn")


@functools.lru_cache(maxsize=64)
def causal_bits(t: int, device: torch.device) -> torch.Tensor:
    """The causal [t, t] block packed for the triton kernel, made once per (t, device): AR steps and
    prefill reuse it, and a captured CUDA graph never copies it from the host."""
    from trees import pack_mask_bits

    return pack_mask_bits(torch.ones(t, t, dtype=torch.bool).tril()).to(device)


@dataclass
class AttentionContext:
    """What all layers of one forward share. `start`: committed prefix length, an int for the whole
    batch or a [B] device tensor per request; `span`: cache slots the layers read (>= start + T);
    `block_mask` [T, T] bool (None = causal); `sdpa_mask`: the dense boolean mask (sdpa backend);
    `tree_bits` [T, W] int64: block_mask packed 64 columns per word (triton backend); `seqused_k` [B]
    int32 live lengths and `visible` [T, T + 1] int32 (None = causal) for the flash_attn backend."""

    backend: str
    start: int | torch.Tensor
    span: int
    block_mask: torch.Tensor | None
    sdpa_mask: torch.Tensor | None = None
    tree_bits: torch.Tensor | None = None
    seqused_k: torch.Tensor | None = None
    visible: torch.Tensor | None = None

    @classmethod
    def build(cls, backend: str, start: int | torch.Tensor, t: int, span: int, block_mask: torch.Tensor | None,
              tree_bits: torch.Tensor | None, groups: int, device: torch.device, batch: int = 1) -> AttentionContext:
        """Prepare the mask once per forward (tree_bits, when given, is block_mask already packed on the
        device: required inside a CUDA graph)."""
        if backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}; choose from {', '.join(BACKENDS)}")
        ctx = cls(backend, start, span, block_mask)
        if backend == "sdpa":
            plain_prefill = isinstance(start, int) and start == 0 and block_mask is None
            if not plain_prefill:
                ctx.sdpa_mask = reference_mask(start, block_mask, t, span, groups, device)
        elif backend == "flash_attn":
            ctx.seqused_k = flash4.live_lengths(start, t, batch, device)
            ctx.visible = flash4.visible_table(block_mask.to(device)) if block_mask is not None else None
        elif tree_bits is not None:
            ctx.tree_bits = tree_bits
        elif block_mask is None:
            ctx.tree_bits = causal_bits(t, device)
        else:
            from trees import pack_mask_bits

            ctx.tree_bits = pack_mask_bits(block_mask.cpu()).to(device)
        return ctx


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
    """q [B, Hq, T, D]; k, v [B, Hkv, >= span, D] of one layer's cache (slots past `span` are never read)."""
    k, v = k[:, :, : ctx.span], v[:, :, : ctx.span]
    if ctx.backend == "sdpa":
        return tree_attention_reference(q, k, v, ctx.start, ctx.block_mask, ctx.sdpa_mask)
    if ctx.backend == "flash_attn":
        return flash4.flash4_attention(q, k, v, ctx.seqused_k, ctx.visible)
    return tree_attention(q, k, v, ctx.start, tree_bits=ctx.tree_bits)
