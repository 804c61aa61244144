"""Programmatic dependent launch (PDL; Hopper and later) for every kernel of ours: off unless asked for.

Inside a replayed CUDA graph a kernel starts only once the kernel before it has drained: the GPU
finishes the last programs of one, flushes its writes, then launches and ramps up the next. A 7B-shape
AR step is ~300 kernels, and the queued step was 0.12 ms longer than the sum of its kernels (one
H200, benchmarks/README.md). With PDL a kernel is launched while its predecessor still runs: its
programs become resident and wait at `griddepcontrol.wait` until the predecessor has completed and its
memory is visible, so the launch and ramp-up overlap the predecessor's tail.

The rule every kernel here follows (`wait_then_release`, its first statement, in every program): wait
for the previous kernel, then let the next one launch. Waiting first keeps stream order transitive: a
kernel completes only after the one before it did, so a kernel two launches later (or a cuBLAS or
torch kernel, launched without PDL, which waits for full completion anyway) still sees every earlier
write; and no program writes anything, in place or not, before its predecessor is done.

Why it is off by default: on one H100 (benchmarks/README.md, 2026-12-07; one run each) it made the
graphed AR step faster (demo 8.7 %, SmolLM2 1.7 %) and SmolLM2's 63-node step 2.6 % faster, but the
demo's 63-node step 4.6 % slower, and why was not found; a Medusa run is mostly tree steps.
`MEDUSA_WORKBENCH_PDL=1` in the environment at start turns it on, where it can run: compute capability
9.0 or later, a Triton with grid dependency control (3.4+), not Triton's interpreter. It is read once,
as a launch must cost no more host time than it did. The arithmetic is the same either way.
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs run no kernel
    triton = None

ENV = "MEDUSA_WORKBENCH_PDL"
HAS_GDC = False
if triton is not None:
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

        HAS_GDC = True
    except ImportError:  # a Triton before grid dependency control: kernels launch as before
        @triton.jit
        def gdc_wait():
            pass

        @triton.jit
        def gdc_launch_dependents():
            pass

    @triton.jit
    def wait_then_release(PDL: tl.constexpr):
        """A kernel's first statement: wait for the previous kernel to complete, then let the next one launch."""
        if PDL:
            gdc_wait()
            gdc_launch_dependents()

# off for the process: not asked for, or kernels run by the interpreter (which has no griddepcontrol)
disabled = not HAS_GDC or os.environ.get(ENV, "0") != "1" or os.environ.get("TRITON_INTERPRET") == "1"
_ON: dict[int, bool] = {}


def enabled(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL: CUDA at compute capability 9.0 or later, unless `disabled`."""
    if disabled or device.type != "cuda" or torch.version.hip is not None:  # ROCm reports a CUDA device, no PDL
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _ON:
        _ON[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return _ON[index]


def options(t: torch.Tensor) -> dict:
    """A launch's keyword arguments for a kernel with a `PDL` constexpr, whose inputs live where `t` does.
    `launch_pdl` is passed only when on, so a launch with PDL off is the plain launch on any backend."""
    return {"PDL": True, "launch_pdl": True} if enabled(t.device) else {"PDL": False}
