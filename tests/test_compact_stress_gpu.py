"""The KV compaction kernel under stress: every layout launched thousands of times on deep paths
through non-first children, each launch compared with the torch reference.

A racy kernel is right on most launches: without the barrier between its loads and stores, the
7B shape with a depth-10 path went wrong in 126 of 40,000 launches on an H200, and a test that
launches once per shape passed. So each case here launches `COMPACT_STRESS_LAUNCHES` times (default
2,000; the acceptance run sets 20,000), restores the slots it moves before every launch, and
counts the wrong K/V rows on the device (one host read per case). The path's node j sits at slot
start + 3j, so rows overlap across the program's warps (row j's destination is row j/3's source).

`control` runs the same stress on the kernel built without its barrier: it must find wrong rows,
or the stress has no power to see a race. On CPU, the harness itself is checked against an
in-place copy that overwrites sources before reading them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

from engine.kernels import pdl
from engine.kernels.compact import compact_reference

LAUNCHES = int(os.environ.get("COMPACT_STRESS_LAUNCHES", "2000"))
QUICK_LAUNCHES = 200
SPREAD = 3  # path node j at slot start + SPREAD * j
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@dataclass(frozen=True)
class Case:
    dtype: torch.dtype
    d: int
    rows: int  # accepted path length, the root included (the depth is rows - 1)
    layers: int = 2
    heads: int = 8
    starts: tuple[int, ...] = (7, 300)  # one request per start
    capacity: int = 1024


CASES = {f"{name}-d{d}-n{n}": Case(dtype, d, n) for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32))
         for d in (64, 128) for n in (16, 64)}
CASES["7b-bf16-depth10"] = Case(torch.bfloat16, 128, 11, layers=32, heads=32, starts=(1024,), capacity=2048)


def wrong_rows(case: Case, launches: int, device: str, move) -> tuple[int, int]:
    """(wrong K/V rows summed over launches, launches with any) of `move(k, v, src, dst)` against
    compact_reference, each launch on the same freshly restored slots."""
    gen = torch.Generator(device=device).manual_seed(case.d * 1000 + case.rows)
    shape = (case.layers, len(case.starts), case.heads, case.capacity, case.d)
    k = torch.randn(shape, generator=gen, device=device).to(case.dtype)
    v = torch.randn(shape, generator=gen, device=device).to(case.dtype)
    starts = torch.tensor(case.starts, device=device)[:, None]
    steps = torch.arange(case.rows, device=device)[None]
    src, dst = starts + SPREAD * steps, starts + steps
    lo, hi = min(case.starts), max(case.starts) + SPREAD * (case.rows - 1) + 1  # every slot a launch touches
    want_k, want_v = k.clone(), v.clone()
    compact_reference(want_k, want_v, src, dst)
    want_k, want_v = want_k[..., lo:hi, :].clone(), want_v[..., lo:hi, :].clone()
    first_k, first_v = k[..., lo:hi, :].clone(), v[..., lo:hi, :].clone()
    rows = torch.zeros((), dtype=torch.long, device=device)
    bad_launches = torch.zeros((), dtype=torch.long, device=device)
    for _ in range(launches):
        k[..., lo:hi, :].copy_(first_k)
        v[..., lo:hi, :].copy_(first_v)
        move(k, v, src, dst)
        bad = (k[..., lo:hi, :] != want_k).any(-1) | (v[..., lo:hi, :] != want_v).any(-1)  # [L, B, H, slots]
        rows += bad.sum()
        bad_launches += bad.any()
    return int(rows), int(bad_launches)


def launch_counts():
    return [pytest.param(QUICK_LAUNCHES, marks=pytest.mark.gpu_quick, id="quick"), pytest.param(LAUNCHES, id="full")]


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("launches", launch_counts())
@pytest.mark.parametrize("name", list(CASES))
def test_compaction_kernel_is_right_on_every_launch(name, launches):
    from engine.kernels.compact import compact

    rows, bad = wrong_rows(CASES[name], launches, "cuda", compact)
    assert rows == 0, f"{name}: {rows} wrong K/V rows in {bad} of {launches} launches"


@pytest.mark.gpu
@cuda
@pytest.mark.xfail(strict=False, reason="on one H200 (2026-12-04) the kernel without its barrier gave 0 wrong rows in "
                   "20,000 launches of both layouts: the race is not reproduced there, so the barrier's proof is the "
                   "PTX check below (benchmarks/compact_stress_gpu_2026-12-04.log)")
@pytest.mark.parametrize("name", ["bf16-d128-n16", "bf16-d128-n64"])
def test_control_the_kernel_without_its_barrier_is_caught(name):
    from engine.kernels.compact import compact

    rows, bad = wrong_rows(CASES[name], LAUNCHES, "cuda", lambda k, v, s, d: compact(k, v, s, d, barrier=False))
    assert rows > 0, f"{name}: no wrong row in {LAUNCHES} launches of the racy kernel: the stress cannot see a race"


def copy_in_place_backwards(k, v, src, dst):
    """Row by row, last row first, each read just before its write: a later row's destination is an
    earlier row's source, so this overwrites sources before they are read (the race, made certain)."""
    for i in reversed(range(src.shape[1])):
        compact_reference(k, v, src[:, i : i + 1], dst[:, i : i + 1])


@pytest.mark.parametrize("name", ["fp32-d64-n16", "bf16-d128-n64"])
def test_harness_counts_what_a_wrong_copy_breaks_and_nothing_else(name):
    case = CASES[name]
    assert wrong_rows(case, 3, "cpu", compact_reference) == (0, 0)
    rows, bad = wrong_rows(case, 3, "cpu", copy_in_place_backwards)
    # rows j with 3j >= rows read a slot nobody writes; every other row but the root reads a slot a
    # later row (written first) has overwritten: in every layer, request and head, on every launch
    clobbered = len([j for j in range(1, case.rows) if SPREAD * j < case.rows])
    assert bad == 3 and rows == 3 * clobbered * case.layers * len(case.starts) * case.heads


def test_compiled_kernel_stores_nothing_before_every_load_is_done():
    """The race's cause, checked without a GPU: Triton compiles the kernel for sm_90 here (with PDL's wait,
    as Hopper runs it with MEDUSA_WORKBENCH_PDL=1, where Triton has it), and in the PTX every global load
    comes before the block barrier and every global store after it (the kernel built without its barrier
    has none: the layout the race was measured on)."""
    triton = pytest.importorskip("triton", reason="Triton is not installed (it compiles for CUDA without a GPU)")
    from triton.backends.compiler import GPUTarget

    from engine.kernels.compact import _compact

    signature = {"K": "*bf16", "V": "*bf16", "Src": "*i64", "Dst": "*i64", **dict.fromkeys(("B", "H", "n"), "i32"),
                 **dict.fromkeys(("skl", "skb", "skh", "sks", "svl", "svb", "svh", "svs"), "i64"),
                 **dict.fromkeys(("BLOCK_N", "BLOCK_D", "D", "BARRIER", "PDL"), "constexpr")}

    def ptx(barrier: bool, rows: int, d: int) -> list[str]:
        src = triton.compiler.ASTSource(fn=_compact, signature=signature,
                                        constexprs={"BLOCK_N": rows, "BLOCK_D": d, "D": d, "BARRIER": barrier,
                                                    "PDL": pdl.HAS_GDC})
        return triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"].splitlines()

    for rows, d in ((16, 128), (64, 128), (16, 64)):
        lines = ptx(True, rows, d)
        at = lambda op: [i for i, line in enumerate(lines) if op in line]  # noqa: E731
        assert len(at("bar.sync")) == 1, (rows, d)
        assert max(at("ld.global")) < at("bar.sync")[0] < min(at("st.global")), (rows, d)
        assert not [line for line in ptx(False, rows, d) if "bar.sync" in line]
