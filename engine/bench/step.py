"""bench --part step (CUDA): one decoding step at the Llama-2-7B (MHA) and Llama-3-8B (GQA, 128k
vocabulary) shapes, and at SmolLM2-135M's and the demo model's (30 and 5 thin layers: the launch-bound
regime), with random bf16 weights: our AR step and tree steps of 16/32/63/64 nodes (forward, lm_head, greedy verification,
compaction, next heads) eager, replayed from a CUDA graph, and graphed with the fused kernels; against
the weight-read floor and `transformers` generate on the same tensors. Our models are made by the
engine's own factory (`loading.build_model` + `fill_model`)."""

from __future__ import annotations

import functools

import trees

from ..accept import RULES
from ..config import ModelArgs
from ..cudagraph import graphed_us
from ..decode import ar_step, prefill, tree_step
from ..gemm_choice import past_l2
from ..graphs import GREEDY, StepGraphs
from ..heads import MedusaHeads
from ..loading import build_model, fill_model
from .common import copy_bandwidth, cuda_ms

SHAPES = {
    "demo": dict(vocab_size=8192, hidden_size=384, intermediate_size=896, num_hidden_layers=5, num_attention_heads=6,
                 num_key_value_heads=2, head_dim=64, max_position_embeddings=4096),
    "llama2-7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096),
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0),
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0),
}
# 63 and 64 nodes: with the root, 64 and 65 tokens; past 64 the tree block takes a second 64-key iteration and
# mask word in the attention, and a second row tile at MHA shapes (benchmarks/README.md, "Past 64 tokens")
TREE_SIZES = (16, 32, 63, 64)
TOP_KERNELS = 24  # kernels listed by name per profiled step
HEAD_ACCURACY = [[0.6, 0.15, 0.08, 0.05, 0.03]] * 4  # shapes the benchmark trees (best-first under independence)


def random_pair(shape: str, backend: str, fused: bool, hf=None, gemm: str = "cublas", dtype: str = "bfloat16",
                decisive: bool = False, device: str = "cuda"):
    """(transformers model with random weights (bf16 unless told) on `device`, our model sharing its
    tensors). decisive: the weights rewritten by `oracle.make_decisive` (greedy output robust to rounding)."""
    import torch
    import transformers

    dt = getattr(torch, dtype)
    cfg = transformers.LlamaConfig(**SHAPES[shape], tie_word_embeddings=False)
    if hf is None:
        with torch.device(device):
            hf = transformers.LlamaForCausalLM._from_config(cfg, dtype=dt).eval()
        if decisive:
            from .oracle import make_decisive

            make_decisive(hf)
    args = ModelArgs.from_hf_config({**cfg.to_dict(), "model_type": "llama"}, where=shape)
    ours, _, _ = fill_model(build_model(args, backend=backend, fused=fused, gemm=gemm),
                            hf.state_dict().items(), device, dt, shape, share=True)
    return hf, ours


def weight_bytes(hf) -> int:
    """Bytes a batch-1 step reads in weights: every one but the embedding (a row lookup), once. Over the
    copy bandwidth, the step's weight-read floor."""
    return sum(v.numel() * v.element_size() for k, v in hf.state_dict().items() if "embed_tokens" not in k)


def random_heads(dim: int) -> MedusaHeads:
    """Four one-ResBlock heads with small random weights, bf16 on CUDA: the step benchmarks' stand-in
    for trained heads (a step's time depends on their shapes, not on their accuracy)."""
    import torch

    heads = MedusaHeads(4, 1, dim, None).to("cuda", torch.bfloat16)
    with torch.no_grad():
        heads.weight.normal_(0, 0.01)
    return heads


def step_runs(heads: MedusaHeads, sizes) -> list[tuple]:
    """The steps a step benchmark times: ("ar", None, None, None), then per size n ("tree_n", heads, the
    tree's buffers on CUDA, its graph key), the trees shaped by HEAD_ACCURACY."""
    runs = [("ar", None, None, None)]
    for n in sizes:
        tree = trees.best_tree_independent(HEAD_ACCURACY, n)
        runs.append((f"tree_{n}", heads, trees.buffers(tree, topk=10).to("cuda"), StepGraphs.tree_key(tree)))
    return runs


def best_queued_ms(graphs: StepGraphs, model, run: tuple, prompt: list[int], iters: int, tries: int) -> float:
    """The best of `tries` `queued_ms` timings of one of `step_runs`' steps, each from a fresh prefill."""
    _, heads, buf, key = run
    return min(queued_ms(graphs, heads, buf, key, prefill(model, heads, [prompt], GREEDY, None), iters=iters)
               for _ in range(tries))


def step_kernels(graphs: StepGraphs, model, run: tuple, prompt: list[int]) -> dict:
    """`kernel_breakdown` of one of `step_runs`' steps replayed from its graph, after a fresh prefill."""
    _, heads, buf, key = run
    state = prefill(model, heads, [prompt], GREEDY, None)
    return kernel_breakdown(lambda: graphs.step(heads, buf, key, state))


def run_step(shapes: list[str], prefix: int, backend: str) -> dict:
    import torch

    bw = copy_bandwidth()
    out = {"copy_bandwidth_GBps": round(bw / 1e9, 1), "prefix": prefix, "backend": backend, "rows": []}
    for name in shapes:
        hf, plain = random_pair(name, backend, fused=False)
        _, fused = random_pair(name, backend, fused=True, hf=hf)
        _, skinny = random_pair(name, backend, fused=True, hf=hf, gemm="skinny")
        _, auto = random_pair(name, backend, fused=True, hf=hf, gemm="auto")
        heads = random_heads(hf.config.hidden_size)
        nbytes = weight_bytes(hf)
        floor_ms = nbytes / bw * 1e3
        row = {"shape": name, "weight_GB": round(nbytes / 1e9, 2), "weight_floor_ms": round(floor_ms, 3)}
        prompt = torch.randint(0, hf.config.vocab_size, (prefix,)).tolist()
        tree_of = {n: trees.best_tree_independent(HEAD_ACCURACY, n) if n else None for n in (0, *TREE_SIZES)}
        buf_of = {n: trees.buffers(c, topk=10).to("cuda") if n else None for n, c in tree_of.items()}
        row["gemm"] = gemm_table(fused, bw)
        for variant, model, graphed in (("", plain, False), ("_graph", plain, True), ("_graph_fused", fused, True),
                                        ("_graph_fused_skinny", skinny, True), ("_graph_fused_auto", auto, True)):
            model.setup_cache(1, prefix + 1024)
            graphs = StepGraphs(model) if graphed else None
            for n, choices in tree_of.items():
                key, buf, tree_key = ("ar" if n == 0 else f"tree_{n}"), buf_of[n], StepGraphs.tree_key(choices)
                state = prefill(model, heads if n else None, [prompt], GREEDY, None)

                def step(graphs=graphs, n=n, tree_key=tree_key, buf=buf, state=state, model=model):
                    if graphs is not None:
                        return graphs.step(heads if n else None, buf, tree_key, state)
                    if n:
                        return tree_step(model, heads, buf, state, RULES["greedy"], GREEDY, None)
                    return ar_step(model, state, GREEDY, None)

                row[f"{key}{variant}_ms"] = round(cuda_ms(step), 3)
                if graphs is not None:
                    row[f"{key}{variant}_queued_ms"] = round(queued_ms(graphs, heads if n else None, buf, tree_key, state), 3)
                if variant in ("_graph_fused", "_graph_fused_auto") and n in (0, 63):  # 63: issue 27's tree size
                    # where the GPU time of a step goes: the same kernels launched eagerly, and replayed
                    state = prefill(model, heads if n else None, [prompt], GREEDY, None)
                    name_ = key + variant.removeprefix("_graph_fused")
                    row[f"{name_}_kernels"] = kernel_breakdown(functools.partial(step, graphs=None, state=state))
                    row[f"{name_}_graph_kernels"] = kernel_breakdown(step)
            model.cache = None
        row["gemm_choice"] = auto.gemm_choice.chosen() if auto.gemm_choice is not None else []
        for v in ("", "_graph", "_graph_fused", "_graph_fused_skinny", "_graph_fused_auto", "_graph_queued",
                  "_graph_fused_queued", "_graph_fused_skinny_queued", "_graph_fused_auto_queued"):
            row[f"ar{v}_over_floor"] = round(row[f"ar{v}_ms"] / floor_ms, 3)
            for n in TREE_SIZES:
                row[f"tree_{n}{v}_over_ar{v}"] = round(row[f"tree_{n}{v}_ms"] / row[f"ar{v}_ms"], 3)
        ids = torch.tensor([prompt], device="cuda")

        def hf_gen(new):
            return lambda: hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)

        with torch.inference_mode():
            per_token = (cuda_ms(hf_gen(33), 5) - cuda_ms(hf_gen(1), 5)) / 32
        row["transformers_generate_ms_per_token"] = round(per_token, 3)
        row["transformers_over_ours_ar_graph_fused"] = round(per_token / row["ar_graph_fused_ms"], 3)
        out["rows"].append(row)
        hf = plain = fused = skinny = auto = None  # free this shape's weights before the next
        torch.cuda.empty_cache()
    return out


def queued_ms(graphs: StepGraphs, heads, buf, tree_key, state, iters: int = 50) -> float:
    """Mean ms per graphed step with the next step queued before the last one is read, as the
    engine's session runs greedy graphs: the host's work per step (launch, reading the packed
    result) overlaps the device's, which a synchronous step (`cuda_ms`) waits for."""
    import time

    import torch

    ahead = buf.retrieve_indices.shape[1] if buf is not None else 1
    pending = graphs.launch(heads, buf, tree_key, state, ahead=ahead)
    t0 = time.perf_counter()
    for _ in range(iters):
        nxt = graphs.launch(heads, buf, tree_key, state, ahead=ahead)
        graphs.collect(pending, state)
        pending = nxt
    graphs.collect(pending, state)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e3


def gemm_table(model, bw: float) -> list[dict]:
    """Each projection of one layer (and lm_head) at M = 1, 16, 64 rows: cuBLAS (F.linear) against our
    skinny GEMM, µs per call, and the weight-read bandwidth each reaches over the measured copy
    bandwidth. Timed as a step runs them: back to back inside one replayed CUDA graph, over enough
    copies of the weight (`gemm_choice.past_l2`: >= 256 MB in all) that none is read from L2, so a
    call's time is its kernels' and not a launch's or an event's (single timed calls read 0.4-0.8 of
    copy bandwidth where the same GEMMs inside a step's graph read ~0.85 on average)."""
    import torch

    from ..kernels import gemv

    layer = model.layers[0]
    mats = {"qkv": layer.self_attn.qkv_proj.weight, "o": layer.self_attn.o_proj.weight,
            "gate_up": layer.mlp.gate_up_proj.weight, "down": layer.mlp.down_proj.weight, "lm_head": model.lm_head.weight}
    rows = []
    for name, w in mats.items():
        n, k = w.shape
        nbytes = n * k * w.element_size()
        copies = past_l2([(w, None)])
        for m in (1, 16, 64):
            x = torch.randn(m, k, device="cuda", dtype=w.dtype)
            ref = torch.nn.functional.linear(x, w)
            err = ((gemv.linear(x, w).float() - ref.float()).norm() / ref.float().norm()).item()
            cublas = graphed_us(lambda c: torch.nn.functional.linear(x, c[0]), copies)
            ours = graphed_us(lambda c: gemv.linear(x, c[0]), copies)
            rows.append({"matrix": name, "N": n, "K": k, "M": m, "copies": len(copies),
                         "cublas_us": round(cublas, 2), "ours_us": round(ours, 2),
                         "cublas_of_copy_bw": round(nbytes / (cublas * 1e-6) / bw, 3),
                         "ours_of_copy_bw": round(nbytes / (ours * 1e-6) / bw, 3), "ours_rel_error": float(f"{err:.1e}")})
        del copies
    return rows


def kernel_breakdown(fn, steps: int = 5) -> dict:
    """GPU time per step of fn's kernels by kind, from the profiler: what a captured step costs
    once launch gaps are gone (their sum against the graph's time is the gap left). fn may replay a
    CUDA graph: the profiler sees the kernels of its nodes (none seen means it could not)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    kinds: dict[str, list[float]] = {}
    named: list[tuple[float, float, str]] = []  # (µs per step, launches per step, kernel name)
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        if us is None:
            us = e.cuda_time_total
        if us <= 0:  # host-side events (launch calls) carry no device time
            continue
        name = e.key.lower()
        kind = ("attention" if any(w in name for w in ("tree_attn", "merge_splits", "flashattention", "flash_fwd")) else
                "gemm" if any(w in name for w in ("gemm", "gemv", "nvjet", "cutlass", "sm90", "splitk", "_skinny")) else
                "fused pointwise (ours)" if any(w in name for w in ("_add_rms_norm", "_rope_qkv", "_silu_mul")) else
                "compaction" if "_compact" in name else
                "medusa step (ours)" if any(w in name for w in ("_chunk_topk", "_merge_topk", "_merge_draft", "_merge_accept",
                                                                  "_trace")) else
                "index/copy" if any(w in name for w in ("index", "copy", "memcpy", "memset", "scatter", "gather", "cat"))
                else "other")
        named.append((us / steps, e.count / steps, e.key))
        k = kinds.setdefault(kind, [0.0, 0])
        k[0] += us / steps / 1e3
        k[1] += e.count / steps
    total = sum(v[0] for v in kinds.values())
    return {"kernel_ms": round(total, 3), "kernels": round(sum(v[1] for v in kinds.values())),
            "by_kind": {k: {"ms": round(v[0], 3), "kernels": round(v[1])} for k, v in
                        sorted(kinds.items(), key=lambda kv: -kv[1][0])},
            # which kernels: the kinds above say where time goes, these which launch to make cheaper
            "top": [{"kernel": name[:80], "us": round(us, 2), "per_step": round(n, 2)}
                    for us, n, name in sorted(named, reverse=True)[:TOP_KERNELS]]}

