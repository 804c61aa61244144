"""Why the ResBlock tail's float32 outputs differ from torch's in their last bits on a GPU (no GPU needed):
`python3 benchmarks/silu_fp32_bits.py`. Compiles `pointwise._residual_silu` for sm_90 in float32 and lists its
exp and division instructions, then emulates on the CPU the mildest difference they imply (x * log2(e) rounded to
float32 before an exact exp2, an IEEE division) on random normal data of the GPU test's shape, and prints the
fraction of `r + SiLU(y)` outputs that differ from torch's. One JSON line."""

from __future__ import annotations

import json
import re

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from engine.kernels import pointwise

SIGNATURE = {"R": "*fp32", "Y": "*fp32", "Out": "*fp32", "n": "i32", "rows_per_head": "i32", "s_rk": "i32",
             "s_rn": "i32", "BLOCK": "constexpr", "PDL": "constexpr"}


def main() -> None:
    src = ASTSource(fn=pointwise._residual_silu, signature=SIGNATURE, constexprs={"BLOCK": 512, "PDL": False})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    ops = sorted(set(re.findall(r"\b((?:ex2|div|rcp)\.[\w.]+)", ptx)))
    gen = torch.Generator().manual_seed(0)
    y, r = torch.randn(4 * 3 * 384, generator=gen), torch.randn(4 * 3 * 384, generator=gen)
    want = r + torch.nn.functional.silu(y)
    product = -y * torch.tensor(1.4426950408889634, dtype=torch.float32)  # rounded to float32, as in the kernel
    got = r + y / (1.0 + torch.exp2(product.double()).float())
    print(json.dumps({"ptx_ops": ops, "fraction_differing": round((got != want).float().mean().item(), 4)}))


if __name__ == "__main__":
    main()
