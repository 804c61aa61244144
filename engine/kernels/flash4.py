"""The `flash_attn` backend: FlashAttention-4 (the `flash-attn-4` CuTe DSL kernels, an external
package) computing the same function as `tree_attention_reference` (docs/attention.md).

How the function maps onto FA4's forward (`flash_attn.cute.flash_attn_varlen_func`):
- K/V are read straight from our cache [B, Hkv, S, D] as the strided view [B, S, Hkv, D]; no copy.
- `seqused_k[b] = start[b] + T` is each request's live length, read on the device, so one captured
  CUDA graph serves every length; slots past it are never attended. They must hold finite values
  (FA4 loads whole key tiles and multiplies P = 0 by them): the engine's cache only ever holds zeros
  or stale K/V there.
- A causal block (prefill, AR) is FA4's `causal=True`, aligned bottom-right, i.e. at `start`.
- A tree block is a `mask_mod` over an aux tensor `visible` [T, T + 1] int32: column 0 is 1 (the
  prefix), column 1 + j is block_mask[:, j]. Key n of query row m maps to column
  clamp(n - prefix + 1, 0, T), so the mask is one load and no branch.

FA4 runs bf16/fp16 on SM80+ (the Hopper path has no split-KV, so long prefixes at batch 1 use few
SMs). It is found on the import path, or in a directory named by FLASH_ATTN_SITE (a `pip install
--target` folder, added with site.addsitedir so its .pth file is read: benchmarks/fa4_install.sh).
"""

from __future__ import annotations

import functools
import os
import site

import torch

SITE_ENV = "FLASH_ATTN_SITE"
DTYPES = (torch.bfloat16, torch.float16)


@functools.lru_cache(maxsize=1)
def _import():
    """(flash_attn.cute module, None) or (None, the reason it cannot be used)."""
    where = os.environ.get(SITE_ENV)
    if where:
        site.addsitedir(where)
    try:
        import flash_attn.cute as fa4
    except Exception as e:  # ImportError, or a broken CUDA/DSL install raising at import
        hint = f" (also looked in {SITE_ENV}={where})" if where else f" (set {SITE_ENV} to a pip --target folder)"
        return None, f"FlashAttention-4 is not importable: {type(e).__name__}: {e}{hint}"
    return fa4, None


def unavailable_reason(device: torch.device | None = None) -> str | None:
    """None when the backend can run here, else one line saying why not."""
    if not torch.cuda.is_available() or (device is not None and device.type != "cuda"):
        return "the flash_attn backend (FlashAttention-4) needs a CUDA device"
    if torch.cuda.get_device_capability(device if device is not None and device.index is not None else None)[0] < 8:
        return "FlashAttention-4 needs an SM80 or newer GPU"
    return _import()[1]


@functools.lru_cache(maxsize=1)
def _tree_mask_mod():
    """The mask_mod, made once: FA4 keys its compile cache by the callable, so one definition means
    one compiled kernel per (dtype, head dim, GQA ratio) for every tree and length."""
    import cutlass
    import cutlass.cute as cute
    from flash_attn.cute import utils

    @cute.jit
    def tree_visible(batch, head, m_idx, n_idx, seqlen_info, aux_tensors):
        visible = aux_tensors[0]
        last = seqlen_info.seqlen_q - 1  # T - 1
        prefix = seqlen_info.seqlen_k - seqlen_info.seqlen_q  # live length before the block
        row = cutlass.min(m_idx[0], last)  # rows of a partial last tile are clamped, then discarded
        col = cutlass.max(cutlass.min(n_idx[0] - prefix + 1, last + 1), cutlass.Int32(0))
        return utils.scalar_to_ssa(visible[row, col], cutlass.Int32) == utils.scalar_to_ssa(1, cutlass.Int32)

    return tree_visible


def visible_table(block_mask: torch.Tensor) -> torch.Tensor:
    """block_mask [T, T] bool -> the mask_mod's aux tensor [T, T + 1] int32 (column 0: the prefix)."""
    t = block_mask.shape[0]
    table = torch.ones(t, t + 1, dtype=torch.int32, device=block_mask.device)
    table[:, 1:] = block_mask.to(torch.int32)
    return table


def live_lengths(start: int | torch.Tensor, t: int, batch: int, device: torch.device) -> torch.Tensor:
    """seqused_k: start + T per request, int32 on the device."""
    if isinstance(start, int):
        return torch.full((batch,), start + t, dtype=torch.int32, device=device)
    return (start + t).to(torch.int32)


def flash4_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqused_k: torch.Tensor,
                     visible: torch.Tensor | None) -> torch.Tensor:
    """q [B, Hq, T, D]; k, v [B, Hkv, S, D] (S >= every live length); seqused_k [B] int32;
    visible: `visible_table(block_mask)`, or None for a causal block. Returns [B, Hq, T, D]."""
    fa4, why = _import()
    if fa4 is None:
        raise RuntimeError(why)
    if q.dtype not in DTYPES:
        raise ValueError(f"the flash_attn backend runs bfloat16/float16, not {q.dtype}; use --backend triton")
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, T|S, H, D] views
    if visible is None:
        out = fa4.flash_attn_varlen_func(qt, kt, vt, seqused_k=seqused_k, causal=True)
    else:
        out = fa4.flash_attn_varlen_func(qt, kt, vt, seqused_k=seqused_k, mask_mod=_tree_mask_mod(),
                                         aux_tensors=[visible])
    out = out[0] if isinstance(out, tuple) else out
    return out.transpose(1, 2)
