"""The decoder's pointwise sublayers: torch references, and one Triton kernel each for the fused path.

At batch 1 a 7B layer is a handful of weight-bound GEMVs plus pointwise work that eagerly is ~30
tiny kernels (RMSNorm alone is seven), each a few microseconds whatever its size. Here the residual
add and the next RMSNorm are one kernel, and SiLU(gate) * up is one kernel (or, at one row with our skinny GEMM,
part of the down projection's: `silu_mul_tile`, engine/kernels/gemv.py). A Medusa ResBlock's SiLU and
residual add after its linear layer are one kernel too (engine/heads.py). The kernels round where
the references round (transformers' order: add in the model dtype; normalise in fp32, cast back,
then scale by the weight in the model dtype), so the fused path is tested against these references.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs use the references
    triton = None

from . import pdl

if triton is not None:
    from .pdl import wait_then_release


# -- references -----------------------------------------------------------------------------------
def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise in float32, cast back, then scale (transformers' order)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rms_norm_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """-> (x + residual, rms_norm(x + residual)): the residual add fused into the next norm."""
    x = x + residual
    return x, rms_norm_reference(x, weight, eps)


def residual_silu_reference(residual: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """residual + SiLU(y): a Medusa ResBlock's tail after its linear layer (engine/heads.py)."""
    return residual + F.silu(y)


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2F] (gate then up, as the stacked GEMM writes them) -> SiLU(gate) * up [..., F]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


# -- kernels --------------------------------------------------------------------------------------
if triton is not None:

    @triton.jit
    def _add_rms_norm(X, R, W, Y, n, eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
        """One program per row: X += R (in X's dtype, in place), Y = W * rms_norm(X)."""
        wait_then_release(PDL)
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        ok = cols < n
        x = tl.load(X + row * n + cols, mask=ok, other=0.0)
        if HAS_RES:
            x = (x.to(tl.float32) + tl.load(R + row * n + cols, mask=ok, other=0.0).to(tl.float32)).to(x.dtype)
            tl.store(X + row * n + cols, x, mask=ok)
        xf = x.to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n + eps)
        h = (xf * inv).to(x.dtype).to(tl.float32)
        w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(Y + row * n + cols, (w * h).to(Y.dtype.element_ty), mask=ok)

    @triton.jit
    def silu_tile(x):
        """SiLU(x) rounded to x's dtype, as torch's F.silu returns it, in float32 for the next operation."""
        xf = x.to(tl.float32)
        return (xf / (1.0 + tl.exp(-xf))).to(x.dtype).to(tl.float32)

    @triton.jit
    def silu_mul_tile(gate, up):
        """SiLU(gate) * up of two tiles in the model's dtype, rounding as torch does (SiLU rounded to the
        dtype, then the product): `_silu_mul`, and the skinny GEMM that applies it as it loads its input
        (engine/kernels/gemv.py), share it, so the two give the same bits."""
        return (silu_tile(gate) * up.to(tl.float32)).to(gate.dtype)

    @triton.jit
    def _silu_mul(GU, Y, f, BLOCK: tl.constexpr, PDL: tl.constexpr):
        """One program per (row, block of features): Y = SiLU(gate) * up."""
        wait_then_release(PDL)
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = cols < f
        gate = tl.load(GU + row * 2 * f + cols, mask=ok, other=0.0)
        up = tl.load(GU + row * 2 * f + f + cols, mask=ok, other=0.0)
        tl.store(Y + row * f + cols, silu_mul_tile(gate, up).to(Y.dtype.element_ty), mask=ok)

    @triton.jit
    def _residual_silu(R, Y, Out, n, rows_per_head, s_rk, s_rn, BLOCK: tl.constexpr, PDL: tl.constexpr):
        """One program per (head, row): Out = R + SiLU(Y), SiLU rounded to the dtype, then the add (torch's
        order). R is read through its strides: the heads' first ResBlock adds the one hidden state they share."""
        wait_then_release(PDL)
        row = tl.program_id(0).to(tl.int64)  # heads x rows x dim passes 2^31 in a training-sized heads pass
        cols = tl.arange(0, BLOCK)
        ok = cols < n
        y = tl.load(Y + row * n + cols, mask=ok, other=0.0)
        r = tl.load(R + (row // rows_per_head) * s_rk + (row % rows_per_head) * s_rn + cols, mask=ok, other=0.0)
        tl.store(Out + row * n + cols, (r.to(tl.float32) + silu_tile(y)).to(Out.dtype.element_ty), mask=ok)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """`add_rms_norm_reference` (or `rms_norm_reference` when residual is None) in one launch.
    x is updated in place by the residual add; returns (x, normed)."""
    n = x.shape[-1]
    rows = x.numel() // n
    x = x.contiguous()
    y = torch.empty_like(x)
    _add_rms_norm[(rows,)](x, residual.contiguous() if residual is not None else x, weight, y, n, eps,
                           HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(n),
                           num_warps=8 if n >= 2048 else 4, **pdl.options(x))
    return x, y


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    f = gate_up.shape[-1] // 2
    rows = gate_up.numel() // (2 * f)
    gate_up = gate_up.contiguous()
    y = torch.empty(*gate_up.shape[:-1], f, device=gate_up.device, dtype=gate_up.dtype)
    block = min(2048, triton.next_power_of_2(f))
    _silu_mul[(rows, triton.cdiv(f, block))](gate_up, y, f, BLOCK=block, **pdl.options(y))
    return y


def residual_silu(residual: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """`residual_silu_reference` in one launch, for y [K, N, d] (contiguous) and residual [K, N, d] of any strides
    (a [N, d] state expanded over the K heads is read in place, once per head)."""
    k, rows, n = y.shape
    if not y.is_contiguous() or residual.shape != y.shape or residual.dtype != y.dtype:
        raise ValueError(f"residual_silu: y {tuple(y.shape)} {y.dtype} must be contiguous and the residual "
                         f"{tuple(residual.shape)} {residual.dtype} of its shape and dtype")
    if residual.stride(-1) != 1:
        residual = residual.contiguous()
    out = torch.empty_like(y)
    _residual_silu[(k * rows,)](residual, y, out, n, rows, residual.stride(0), residual.stride(1),
                                BLOCK=triton.next_power_of_2(n), **pdl.options(y))
    return out
