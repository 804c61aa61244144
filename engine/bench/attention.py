"""bench --part attention (CUDA): our Triton tree kernel against SDPA with a dense mask, compiled
flex_attention and FlashAttention-4 (the tree as a mask_mod; also FA4's plain causal mask on the same
shape, the least FA4 can cost there), for T in {1, 16, 64} x prefix L in {512, 4096, 32768}, 32 query heads, D 128, MHA and
GQA 4:1; each timed by replaying a CUDA graph of 20 calls (launch gaps gone, as inside a decode
step), against the KV-read floor (K and V bytes over the measured copy bandwidth)."""

from __future__ import annotations

import trees

from ..kernels import flash4
from ..kernels.tree_attention import reference_mask, tree_attention, tree_attention_reference
from .common import copy_bandwidth

CALLS_PER_GRAPH = 20


def graph_us(fn) -> float:
    """Median µs of one fn() call, replayed from a CUDA graph of CALLS_PER_GRAPH calls."""
    import torch
    import triton

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(CALLS_PER_GRAPH):
            fn()
    return triton.testing.do_bench(g.replay, warmup=25, rep=200, return_mode="median") * 1e3 / CALLS_PER_GRAPH


def run_attention(markdown: bool) -> dict:
    import torch

    bw = copy_bandwidth()
    try:
        import torch._dynamo
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        torch._dynamo.config.recompile_limit = 256  # one compile per shape; the default 8 falls back to eager
        torch._dynamo.config.cache_size_limit = 256
        flex = torch.compile(flex_attention, dynamic=False)
    except Exception:  # flex_attention missing in this torch
        flex = None
    fa4_missing = flash4.unavailable_reason()
    rows = []
    hq, d, dt = 32, 128, torch.bfloat16
    for hkv in (32, 8):
        for t in (1, 16, 64):
            tree = [list(p) for p in trees.kary(4, 3)][: t - 1]
            block = trees.buffers(tree).attn_mask.cuda() if t > 1 else None
            bits = trees.pack_mask_bits(block.cpu()).cuda() if t > 1 else trees.pack_mask_bits(
                torch.ones(1, 1, dtype=torch.bool)).cuda()
            for L in (512, 4096, 32768):
                q = torch.randn(1, hq, t, d, device="cuda", dtype=dt)
                k = torch.randn(1, hkv, L + t, d, device="cuda", dtype=dt)
                v = torch.randn_like(k)
                start = torch.tensor([L], device="cuda")
                floor_us = 2 * hkv * (L + t) * d * 2 / bw * 1e6
                ours = graph_us(lambda: tree_attention(q, k, v, start, tree_bits=bits))
                dense = reference_mask(start, block, t, L + t, hq // hkv)
                sdpa = graph_us(lambda: tree_attention_reference(q, k, v, start, block, dense))
                ref = tree_attention_reference(q.double(), k.double(), v.double(), start, block)
                err = ((tree_attention(q, k, v, start, tree_bits=bits).double() - ref).norm() / ref.norm()).item()
                row = {"kv_heads": hkv, "T": t, "L": L, "ours_us": round(ours, 2), "sdpa_dense_us": round(sdpa, 2),
                       "floor_us": round(floor_us, 2), "ours_over_floor": round(ours / floor_us, 2),
                       "sdpa_over_ours": round(sdpa / ours, 2), "ours_rel_error": float(f"{err:.2e}")}
                if fa4_missing is None:
                    try:
                        used = flash4.live_lengths(start, t, 1, q.device)
                        vis = flash4.visible_table(block) if block is not None else None
                        row["fa4_tree_us"] = round(graph_us(lambda: flash4.flash4_attention(q, k, v, used, vis)), 2)
                        row["fa4_causal_us"] = round(graph_us(lambda: flash4.flash4_attention(q, k, v, used, None)), 2)
                        got = flash4.flash4_attention(q, k, v, used, vis).double()
                        row["fa4_rel_error"] = float(f"{((got - ref).norm() / ref.norm()).item():.2e}")
                        row["fa4_tree_over_ours"] = round(row["fa4_tree_us"] / ours, 2)
                    except Exception as e:
                        row["fa4_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                if flex is not None:
                    try:
                        blk = block if block is not None else torch.ones(1, 1, dtype=torch.bool, device="cuda")

                        def mask_mod(b, h, qi, kj):
                            return (kj < L) | blk[qi, (kj - L).clamp(0, t - 1)]

                        bm = create_block_mask(mask_mod, 1, 1, t, L + t, device="cuda")
                        row["flex_us"] = round(graph_us(lambda: flex(q, k, v, block_mask=bm, enable_gqa=hkv != hq)), 2)
                    except Exception as e:  # report, do not hide, why flex could not run
                        row["flex_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                rows.append(row)
    out = {"copy_bandwidth_GBps": round(bw / 1e9, 1), "timing": f"CUDA graph of {CALLS_PER_GRAPH} calls",
           "fa4": fa4_missing or "flash_attn.cute (FlashAttention-4)", "rows": rows}
    if markdown:
        lines = ["| KV heads | T | L | ours µs | SDPA dense µs | flex µs | FA4 tree µs | FA4 causal µs | floor µs | "
                 "ours/floor | SDPA/ours |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        keys = ("kv_heads", "T", "L", "ours_us", "sdpa_dense_us", "flex_us", "fa4_tree_us", "fa4_causal_us", "floor_us",
                "ours_over_floor", "sdpa_over_ours")
        lines += ["| " + " | ".join(str(r.get(k, "–")) for k in keys) + " |" for r in rows]
        out["markdown"] = "\n".join(lines)
    return out
