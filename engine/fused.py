"""The decoder's pointwise pieces, eager or fused by `torch.compile` (CUDA only).

Inside a captured decode step the host cost is gone and what remains is the GPU's: at batch 1 a
7B layer is a handful of weight-bound GEMVs plus ~30 tiny pointwise kernels (RMSNorm alone is
seven) that each cost a few microseconds regardless of size. Compiling these few functions fuses
each into one kernel. The math and its order are the eager code's (transformers' RMSNorm order),
so `fused=False` is the reference they are tested against.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise in float32, cast back, then scale (transformers' order)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """-> (x + residual, rms_norm(x + residual)): the residual add fused into the next norm."""
    x = x + residual
    return x, rms_norm(x, weight, eps)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def merge_splits(po: torch.Tensor, pl: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Split-KV partial outputs [N, S, R, D] and log-sum-exps [N, S, R] -> [N, R, D] (empty splits
    have -inf and weigh 0)."""
    w = torch.softmax(pl, dim=1)
    return (po * w[..., None]).sum(1).to(dtype)


EAGER = {"rms_norm": rms_norm, "add_rms_norm": add_rms_norm, "rope": rope, "silu_mul": silu_mul,
         "merge_splits": merge_splits}


@functools.cache
def compiled(name: str):
    # dynamic shapes, yet sizes 0/1 and dtypes still specialise; past Dynamo's recompile limit a
    # call runs eagerly (not fullgraph=True, which would raise): slower, never wrong
    return torch.compile(EAGER[name], dynamic=True)


def op(name: str, fused: bool):
    return compiled(name) if fused else EAGER[name]
