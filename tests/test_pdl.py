"""Programmatic dependent launch's rule, checked in the source (engine/kernels/pdl.py): every kernel of
ours waits for the previous kernel before anything else, and every launch passes the PDL options.

A kernel launched with PDL that read its inputs before `griddepcontrol.wait` would read what the kernel
before it had not yet written, and only now and then; a launch without the options, or a kernel whose
options say PDL but whose body never waits, would break the chain that makes a kernel two launches
later safe. Races do not show on demand, so the rule is checked where it is written. The GPU test
`test_dependent_launch_changes_no_bit_of_a_graphed_run` checks the bits of a run with it on and off."""

import ast
from pathlib import Path

import pytest
import torch

from engine.kernels import pdl

KERNELS = Path(pdl.__file__).parent
MODULES = sorted(p for p in KERNELS.glob("*.py") if p.name not in ("__init__.py", "pdl.py"))


def _is_jit(fn: ast.FunctionDef) -> bool:
    """A Triton kernel or helper, `@triton.jit` or `@triton.jit(...)` (flash4.py's CuTe mask function is
    FlashAttention-4's to launch)."""
    return any(ast.unparse(d.func if isinstance(d, ast.Call) else d) == "triton.jit" for d in fn.decorator_list)


def _jit_functions() -> dict[str, tuple[Path, ast.FunctionDef]]:
    return {node.name: (path, node) for path in MODULES for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef) and _is_jit(node)}


def _called_by_name() -> set[str]:
    """Names called directly (a jit helper is called by a kernel; a kernel is only ever launched)."""
    return {node.func.id for path in MODULES for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}


def _launches() -> list[tuple[Path, ast.Call]]:
    """Every `kernel[grid](...)` call."""
    return [(path, node) for path in MODULES for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)]


def _first_statement(fn: ast.FunctionDef) -> ast.stmt:
    body = fn.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):  # the docstring
        body = body[1:]
    return body[0]


def test_every_kernel_waits_for_the_previous_one_first():
    helpers = _called_by_name()
    kernels = {name: fn for name, (_, fn) in _jit_functions().items() if name not in helpers}
    assert {"_tree_attn_split", "_merge_splits", "_skinny", "_merge_accept", "_compact"} <= set(kernels)
    for name, fn in kernels.items():
        assert fn.args.args[-1].arg == "PDL", f"{name}: no PDL constexpr"
        first = ast.unparse(_first_statement(fn))
        assert first == "wait_then_release(PDL)", f"{name} starts with {first!r}"
    for name, (_, fn) in _jit_functions().items():
        if name in helpers:
            assert "PDL" not in [a.arg for a in fn.args.args], f"{name} is called by kernels, never launched"


def test_every_launch_passes_the_pdl_options():
    launches = _launches()
    assert len(launches) >= 13  # one per kernel at least
    for path, call in launches:
        spread = [ast.unparse(k.value) for k in call.keywords if k.arg is None]
        assert any(s.startswith("pdl.options(") for s in spread), f"{path.name}:{call.lineno} launches without PDL"


def test_pdl_is_off_unless_asked_for():
    """Read once at import: off with the variable unset or not "1" (a fresh interpreter, as a process starts)."""
    import os
    import subprocess
    import sys

    code = "from engine.kernels import pdl; print(pdl.disabled)"
    for value in (None, "0", "yes", "1"):
        env = {k: v for k, v in os.environ.items() if k not in (pdl.ENV, "TRITON_INTERPRET")}
        if value is not None:
            env[pdl.ENV] = value
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
        assert out.strip() == str(value != "1" or not pdl.HAS_GDC), value


def test_pdl_is_off_where_it_cannot_run(monkeypatch):
    assert not pdl.enabled(torch.device("cpu"))
    assert pdl.options(torch.zeros(1))["PDL"] is False
    assert pdl.options(torch.zeros(1)).get("launch_pdl", False) is False
    if torch.cuda.is_available():
        monkeypatch.setattr(pdl, "disabled", True)
        assert not pdl.enabled(torch.device("cuda"))


@pytest.mark.parametrize("name", ["_merge_rows", "_live_splits", "silu_mul_tile", "silu_tile"])
def test_helpers_are_found_as_helpers(name):
    assert name in _jit_functions() and name in _called_by_name()


# kernel -> (its signature's pointer and int arguments, constexprs besides PDL): kernels compiled
COMPILED = {
    "tree_attention._merge_splits": (
        {"PO": "*fp32", "PL": "*fp32", "Out": "*bf16", "Starts": "*i32",
         **dict.fromkeys(("so_b", "so_h", "so_t", "n_kv_heads", "T", "G", "n_splits"), "i32")},
        [dict(BLOCK_R=16, D=128, MIN_SPLIT=256, BLOCK_N=64), dict(BLOCK_R=16, D=64, MIN_SPLIT=256, BLOCK_N=64)]),
    "pointwise._residual_silu": (
        {"R": "*bf16", "Y": "*bf16", "Out": "*bf16", **dict.fromkeys(("n", "rows_per_head", "s_rk", "s_rn"), "i32")},
        [dict(BLOCK=512)]),
    "greedy_step._chunk_topk": (
        {"X": "*bf16", "Vals": "*fp32", "Ids": "*i64", "Max": "*fp32", "SumExp": "*fp32",
         **dict.fromkeys(("V", "n_chunks", "inner", "stride_outer", "stride_inner"), "i32")},
        [dict(K=1, BLOCK=2048, LSE=False), dict(K=10, BLOCK=2048, LSE=True)]),
}


@pytest.mark.parametrize("name", sorted(COMPILED))
def test_kernels_compile_for_hopper_waiting_before_any_memory_access(name):
    """Compiled for sm_90 without a GPU (Triton installed): griddepcontrol.wait comes before every global load
    and store, and launch_dependents after it; without PDL neither is there."""
    triton = pytest.importorskip("triton", reason="Triton is not installed (it compiles for CUDA without a GPU)")
    if not pdl.HAS_GDC:
        pytest.skip("this Triton has no grid dependency control")
    from triton.backends.compiler import GPUTarget

    from engine.kernels import greedy_step, pointwise, tree_attention

    module, kernel = name.split(".")
    fn = getattr({"tree_attention": tree_attention, "pointwise": pointwise, "greedy_step": greedy_step}[module], kernel)
    args, variants = COMPILED[name]
    for constexprs in variants:
        for on in (True, False):
            cx = {**constexprs, "PDL": on}
            src = triton.compiler.ASTSource(fn=fn, signature={**args, **dict.fromkeys(cx, "constexpr")}, constexprs=cx)
            lines = triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"].splitlines()
            at = lambda op: [i for i, line in enumerate(lines) if op in line]  # noqa: E731
            if not on:
                assert not at("griddepcontrol"), (name, cx)
                continue
            wait, release = at("griddepcontrol.wait"), at("griddepcontrol.launch_dependents")
            assert wait and release and wait[0] < release[0], (name, cx)
            assert wait[0] < min(at("ld.global") + at("st.global")), (name, cx)
