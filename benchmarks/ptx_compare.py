"""Whether two checkouts' skinny GEMM kernels compile to the same code, without a GPU:
`python3 benchmarks/ptx_compare.py DIR_A DIR_B` (each DIR holds an `engine/`; Triton installed).

Compiles `engine.kernels.gemv._skinny` of each for sm_90 (Hopper) at every block shape of DIR_A's BLOCKS, 16/32/64-row
tiles (16 also gated), K split at run time or fixed at 1, with and without bias, and compares the PTX (kernel names
and debug sections aside) and the shared memory. A kernel with a `TAIL` parameter (benchmarks/patches/gemv_tail*.diff)
is compiled with TAIL=False. Why: a measurement made with one source counts for another only if they compile alike
(benchmarks/README.md, "Unsplit GEMMs at 64 rows"). Prints one line per differing combination, then the counts.
"""

from __future__ import annotations

import inspect
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

POINTERS = {"X": "*bf16", "W": "*bf16", "B": "*bf16", "Y": "*bf16", "PART": "*fp32", "COUNT": "*i32"}
INTS = ("M", "N", "K", "sx", "sw", "sy", "SM", "SPLIT_K")


def load_gemv(root: str):
    """engine.kernels.gemv imported from `root` (a fresh import each time)."""
    for name in [m for m in sys.modules if m == "engine" or m.startswith("engine.")]:
        del sys.modules[name]
    sys.path.insert(0, root)
    try:
        import engine.kernels.gemv as gemv
    finally:
        sys.path.pop(0)
    return gemv


def normalised(ptx: str) -> str:
    body = re.split(r"\.section\s+\.debug", ptx)[0]
    body = re.sub(r"_skinny\w*", "KERNEL", body)
    return "\n".join(line for line in body.splitlines() if not line.strip().startswith((".loc", ".file", "//")))


def compiled(fn, consts: dict, split_one: bool, warps: int, stages: int) -> tuple[str, int]:
    params = inspect.signature(fn.fn).parameters
    consts = dict(consts, **({"TAIL": False} if "TAIL" in params else {}), **({"SPLIT_K": 1} if split_one else {}))
    signature = {**POINTERS, **{n: "i32" for n in INTS}, **{n: "constexpr" for n in consts}}
    kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": warps, "num_stages": stages})
    return normalised(kernel.asm["ptx"]), kernel.metadata.shared


def main(dir_a: str, dir_b: str) -> None:
    a, b = load_gemv(dir_a), load_gemv(dir_b)
    same = differ = 0
    for m_block, gated in ((16, False), (16, True), (32, False), (64, False)):
        for block_n, block_k, warps, stages in a.BLOCKS:
            for split_one in (False, True):
                for bias in (False, True):
                    consts = {"HAS_BIAS": bias, "GATED": gated, "M_BLOCK": m_block, "BLOCK_N": block_n,
                              "BLOCK_K": block_k, "PDL": False}
                    ptx_a, smem_a = compiled(a._skinny.fn, consts, split_one, warps, stages)
                    ptx_b, smem_b = compiled(b._skinny.fn, consts, split_one, warps, stages)
                    if ptx_a == ptx_b and smem_a == smem_b:
                        same += 1
                    else:
                        differ += 1
                        print(f"differ: rows {m_block}{' gated' if gated else ''}, block {block_n}x{block_k}, "
                              f"{warps} warps, {stages} stages, split {'1' if split_one else 'any'}, bias {bias}: "
                              f"shared {smem_a} / {smem_b} B, PTX lines {len(ptx_a.splitlines())} / {len(ptx_b.splitlines())}")
    print(f"same {same}, differ {differ}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
