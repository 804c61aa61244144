"""`python -m engine bench`: measurements printed as JSON (recorded runs live in benchmarks/).

Parts:
  e2e      tokens/s and tokens/step of AR and Medusa (each --trees entry) on held-out prompts, with
           the check that greedy Medusa output equals AR output on every prompt
  batch    tokens/s of AR and Medusa at batch 1, 2, 4, 8 with best-first trees of several sizes per
           batch (the tree should shrink as the batch grows: verification competes with the batch
           for the same compute), the best tree per batch and where Medusa stops beating AR
  step     (CUDA) one decoding step on random-weight models of the Llama-2-7B (MHA) and Llama-3-8B (GQA,
           128k vocab) shapes in bf16: our AR step and tree steps of 16, 32 and 64 nodes (forward +
           lm_head + greedy verification + compaction) against the weight-read floor, and
           `transformers` greedy generate per token on the same weights
  latency  mean tree-step latency for best-first trees of several sizes (feeds `trees optimize --latency`)
  attention  (CUDA) our Triton tree kernel vs SDPA with a dense mask vs compiled flex_attention, for
           T in {1, 16, 64} x prefix L in {512, 4096, 32768}, 32 query heads, D 128, MHA and GQA 4:1,
           each against the KV-read floor (K and V bytes over measured copy bandwidth)
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import time


def add_bench_args(p) -> None:
    p.add_argument("--part", choices=["e2e", "batch", "latency", "attention", "step"], default="e2e")
    p.add_argument("--shapes", default="llama2-7b,llama3-8b", help="step part: model shapes")
    p.add_argument("--prefix", type=int, default=1024, help="step part: committed tokens before the timed steps")
    p.add_argument("--batches", default="1,2,4,8", help="batch part: batch sizes")
    p.add_argument("--markdown", action="store_true", help="attention part: also print a markdown table")
    p.add_argument("--model", default="demo")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--backend", default="sdpa", choices=["sdpa", "triton"])
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="e2e/batch parts: replay greedy steps from CUDA graphs (default: on with CUDA)")
    p.add_argument("--prompts", type=int, default=12, help="number of held-out prompts")
    p.add_argument("--offset", type=int, default=12, help="skip this many held-out prompts (kept for tuning)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--trees", default="mc_sim_7b_63,demo_tuned", help="comma-separated presets or files")
    p.add_argument("--traces", default=None, help="latency part: traces for best-first trees (default: chains)")
    p.add_argument("--sizes", default="4,8,16,24,32,48,64")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.set_defaults(fn=run_bench)


def _env(eng) -> dict:
    import torch

    dev = eng.device
    return {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(dev) if dev.type == "cuda"
            else f"cpu ({torch.get_num_threads()} threads, {platform.processor() or platform.machine()})",
            "torch": torch.__version__, "dtype": str(eng.model.embed_tokens.weight.dtype).replace("torch.", "")}


def run_e2e(eng, model: str, prompts, max_new, tree_names) -> dict:
    def run(mode, tree=None):
        eng.generate(prompts[0], 8, mode=mode, tree=tree)  # warm-up
        tokens = steps = 0
        outs = []
        t0 = time.perf_counter()
        for p in prompts:
            r = eng.generate(p, max_new, mode=mode, tree=tree)
            tokens, steps = tokens + r.new_tokens, steps + r.steps
            outs.append(r.token_ids)
        wall = time.perf_counter() - t0
        return {"tokens": tokens, "steps": steps, "tokens_per_step": tokens / steps, "wall_s": round(wall, 3),
                "tokens_per_s": round(tokens / wall, 2)}, outs

    ar, ar_out = run("ar")
    # how repetitive greedy text is: repeats are easy to draft, so acceptance should be read beside it
    ratios = [distinct_ngram_ratio(o, 4) for o in ar_out if len(o) >= 4]  # an output cut short by EOS has none
    ar["distinct_4gram_ratio"] = round(sum(ratios) / len(ratios), 3) if ratios else None
    out = {"transformers": run_transformers(eng, model, prompts, max_new, ar_out), "ar": ar, "medusa": {}}
    out["ar"]["speedup_vs_transformers"] = round(ar["tokens_per_s"] / out["transformers"]["tokens_per_s"], 3)
    for name in tree_names:
        m, m_out = run("medusa", name)
        m["nodes"] = len(eng.resolve_tree(name))
        m["speedup_vs_ar"] = round(m["tokens_per_s"] / ar["tokens_per_s"], 3)
        m["greedy_output_equals_ar"] = m_out == ar_out
        out["medusa"][name] = m
    return out


def distinct_ngram_ratio(ids: list[int], n: int) -> float:
    """Distinct n-grams over all n-grams of a token list (1.0: no n-gram repeats); needs >= n tokens."""
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    return len(set(grams)) / len(grams)


def run_transformers(eng, model: str, prompts, max_new: int, ar_out: list[list[int]]) -> dict:
    """The peer: `transformers` greedy generate on the same weights, device and dtype."""
    import torch
    from transformers import AutoModelForCausalLM

    from .loading import resolve_model_dir

    hf = AutoModelForCausalLM.from_pretrained(str(resolve_model_dir(model)), dtype=eng.model.embed_tokens.weight.dtype,
                                              local_files_only=True).to(eng.device).eval()
    eos = sorted(eng.eos_ids)

    def gen(ids, n):
        x = torch.tensor([ids], device=eng.device)
        with torch.inference_mode():
            y = hf.generate(x, max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=eos[0] if eos else 0)
        return y[0, len(ids):].tolist()

    gen(eng.encode(prompts[0]), 8)  # warm-up
    outs = []
    t0 = time.perf_counter()
    for p in prompts:
        outs.append(gen(eng.encode(p), max_new))
    wall = time.perf_counter() - t0
    tokens = sum(map(len, outs))
    return {"tokens": tokens, "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 2),
            "greedy_output_equals_ours_ar": outs == ar_out}


def run_latency(eng, prompts, sizes, traces, rounds: int = 3) -> dict:
    """Median step time per tree size (the AR point runs without heads, as AR decoding does).
    Sizes are measured round-robin, `rounds` times over, and the median taken, so that a noisy
    machine (a shared CPU) shifts every size alike instead of whichever ran during a spike."""
    import statistics

    import trees

    vec = trees.rank_vectors_from_file(traces) if traces else None
    runs = {0: ("ar", None)}
    for n in sizes:
        runs[n] = ("medusa", trees.best_tree_empirical(vec, n) if vec else trees.chain(min(n, eng.num_heads)))
    step_ms: dict[int, list[float]] = {n: [] for n in runs}
    tokens: dict[int, int] = dict.fromkeys(runs, 0)
    for mode, tree in runs.values():
        eng.generate(prompts[0], 8, mode=mode, tree=tree)  # warm-up
    for _ in range(rounds):
        for n, (mode, tree) in runs.items():
            for p in prompts:
                for ev in eng.stream(p, 64, mode=mode, tree=tree):
                    step_ms[n].append(ev.step_ms)
                    tokens[n] += len(ev.tokens)
    med = {n: round(statistics.median(v), 3) for n, v in step_ms.items()}
    curve = [{"nodes": n, "step_ms": med[n], "tokens_per_step": round(tokens[n] / len(step_ms[n]), 3)} for n in sizes]
    return {"ar_step_ms": med[0], "rounds": rounds, "curve": curve,
            "latency_points": [[1, med[0]]] + [[c["nodes"] + 1, c["step_ms"]] for c in curve]}


def run_batch(eng, prompts, max_new, batches, sizes, traces) -> dict:
    import trees

    vec = trees.rank_vectors_from_file(traces) if traces else None
    tree_of = {n: trees.best_tree_empirical(vec, n) if vec else trees.chain(min(n, eng.num_heads)) for n in sizes}

    def run(batch, mode, tree=None):
        group = [prompts[i % len(prompts)] for i in range(batch)]
        eng.generate(group, max_new, mode=mode, tree=tree)  # warm-up: every batch size the run passes through
        t0 = time.perf_counter()
        res = eng.generate(group, max_new, mode=mode, tree=tree)
        wall = time.perf_counter() - t0
        tokens, steps = sum(r.new_tokens for r in res), max(r.steps for r in res)
        return {"tokens": tokens, "steps": steps, "tokens_per_s": round(tokens / wall, 2),
                "tokens_per_step_per_request": round(tokens / sum(r.steps for r in res), 3)}, [r.token_ids for r in res]

    rows = []
    for b in batches:
        ar, ar_out = run(b, "ar")
        row = {"batch": b, "ar": ar, "medusa": {}}
        for n, tree in tree_of.items():
            m, m_out = run(b, "medusa", tree)
            m["speedup_vs_ar"] = round(m["tokens_per_s"] / ar["tokens_per_s"], 3)
            m["greedy_output_equals_ar"] = m_out == ar_out
            row["medusa"][str(n)] = m
        best = max(row["medusa"], key=lambda k: row["medusa"][k]["tokens_per_s"])
        row["best_nodes"], row["best_speedup"] = int(best), row["medusa"][best]["speedup_vs_ar"]
        rows.append(row)
    crossover = next((r["batch"] for r in rows if r["best_speedup"] < 1.0), None)
    return {"trees": {str(n): t for n, t in tree_of.items()}, "rows": rows,
            "first_batch_where_ar_wins": crossover}


SHAPES = {
    "llama2-7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096),
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0),
}


def _cuda_ms(fn, iters: int = 30) -> float:
    """Median wall time of fn() in ms, synchronised."""
    import statistics

    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run_step(shapes, prefix: int, backend: str) -> dict:
    """Real decode steps (engine.decode, random Medusa heads sharing lm_head) after `prefix`
    committed tokens: eager, replayed from CUDA graphs, and graphs of fused pointwise ops; against
    the weight-read floor and transformers generate."""
    import torch
    import transformers

    import trees

    from .config import ModelArgs, rope_inv_freq
    from .decode import ar_step, prefill, tree_step
    from .graphs import GREEDY, StepGraphs
    from .heads import MedusaHeads
    from .model import Transformer

    bw = copy_bandwidth()
    out = {"copy_bandwidth_GBps": round(bw / 1e9, 1), "prefix": prefix, "backend": backend, "rows": []}
    for name in shapes:
        cfg = transformers.LlamaConfig(**SHAPES[name], tie_word_embeddings=False)
        with torch.device("cuda"):
            hf = transformers.LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16).eval()
        with torch.device("meta"):
            ours = Transformer(ModelArgs.from_hf_config(cfg.to_dict(), where=name))
        sd = {k.removeprefix("model."): v for k, v in hf.state_dict().items()}
        ours.load_state_dict(sd, strict=False, assign=True)  # the same tensors: no second copy
        ours.inv_freq = rope_inv_freq(ours.args).cuda()
        ours.backend = backend
        heads = MedusaHeads(4, 1, cfg.hidden_size, None).to("cuda", torch.bfloat16)
        with torch.no_grad():
            heads.weight.normal_(0, 0.01)
        weight_bytes = sum(v.numel() * v.element_size() for k, v in sd.items() if "embed_tokens" not in k)
        floor_ms = weight_bytes / bw * 1e3
        row = {"shape": name, "weight_GB": round(weight_bytes / 1e9, 2), "weight_floor_ms": round(floor_ms, 3)}
        ours.setup_cache(1, prefix + 1024)
        prompt = torch.randint(0, cfg.vocab_size, (prefix,)).tolist()
        tree_of = {n: trees.best_tree_independent([[0.6, 0.15, 0.08, 0.05, 0.03]] * 4, n) if n else None
                   for n in (0, 16, 32, 64)}
        buf_of = {n: trees.buffers(c, topk=10).to("cuda") if n else None for n, c in tree_of.items()}
        # the fused variant comes last: it also stacks q/k/v and gate/up into one GEMM each
        for variant, graphs in (("", None), ("_graph", StepGraphs(ours)), ("_graph_fused", StepGraphs(ours))):
            if variant == "_graph_fused":
                ours.fused = True
                ours.fuse_projections()
            for n, choices in tree_of.items():
                key, buf = ("ar" if n == 0 else f"tree_{n}"), buf_of[n]
                state = prefill(ours, heads if n else None, [prompt], GREEDY, None)

                def step(graphs=graphs, n=n, choices=choices, buf=buf, state=state):
                    if graphs is not None:
                        return graphs.step(heads if n else None, buf, choices, state)
                    if n:
                        return tree_step(ours, heads, buf, state, "greedy", GREEDY, None)
                    return ar_step(ours, None, state, GREEDY, None)

                row[f"{key}{variant}_ms"] = round(_cuda_ms(step), 3)
                if variant == "_graph_fused" and n in (0, 64):
                    # the same kernels launched eagerly, profiled: where the GPU time of a step goes
                    state = prefill(ours, heads if n else None, [prompt], GREEDY, None)
                    row[f"{key}_kernels"] = kernel_breakdown(functools.partial(step, graphs=None, state=state))
        for v in ("", "_graph", "_graph_fused"):
            row[f"ar{v}_over_floor"] = round(row[f"ar{v}_ms"] / floor_ms, 3)
            for n in (16, 32, 64):
                row[f"tree_{n}{v}_over_ar{v}"] = round(row[f"tree_{n}{v}_ms"] / row[f"ar{v}_ms"], 3)
        ids = torch.tensor([prompt], device="cuda")

        def hf_gen(new):
            return lambda: hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)

        with torch.inference_mode():
            per_token = (_cuda_ms(hf_gen(33), 5) - _cuda_ms(hf_gen(1), 5)) / 32
        row["transformers_generate_ms_per_token"] = round(per_token, 3)
        row["transformers_over_ours_ar_graph_fused"] = round(per_token / row["ar_graph_fused_ms"], 3)
        out["rows"].append(row)
        torch.cuda.empty_cache()
    return out


def kernel_breakdown(fn, steps: int = 5) -> dict:
    """GPU time per step of fn's kernels by kind, from the profiler: what a captured step costs
    once launch gaps are gone (their sum against the graph's time is the gap left)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    kinds: dict[str, list[float]] = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        if us is None:
            us = e.cuda_time_total
        if us <= 0:  # host-side events (launch calls) carry no device time
            continue
        name = e.key.lower()
        kind = ("gemm" if any(w in name for w in ("gemm", "gemv", "nvjet", "cutlass", "sm90", "splitk")) else
                "attention" if "tree_attn" in name else
                "fused (compiled)" if name.startswith("triton_") else
                "index/copy" if any(w in name for w in ("index", "copy", "memcpy", "memset", "scatter", "gather", "cat"))
                else "other")
        k = kinds.setdefault(kind, [0.0, 0])
        k[0] += us / steps / 1e3
        k[1] += e.count / steps
    total = sum(v[0] for v in kinds.values())
    return {"kernel_ms": round(total, 3), "kernels": round(sum(v[1] for v in kinds.values())),
            "by_kind": {k: {"ms": round(v[0], 3), "kernels": round(v[1])} for k, v in
                        sorted(kinds.items(), key=lambda kv: -kv[1][0])}}


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    """Measured device-to-device copy bandwidth in bytes/s (bytes read + bytes written)."""
    import torch
    import triton

    x = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=50, rep=200, return_mode="median")
    return 2 * x.numel() / (ms * 1e-3)


def run_attention(markdown: bool) -> dict:
    import torch
    import triton

    import trees

    from .attention import full_mask, sdpa_attention
    from .kernels.tree_attention import tree_attention

    bw = copy_bandwidth()
    try:
        import torch._dynamo
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        torch._dynamo.config.recompile_limit = 256  # one compile per shape; the default 8 falls back to eager
        torch._dynamo.config.cache_size_limit = 256
        flex = torch.compile(flex_attention, dynamic=False)
    except Exception:  # flex_attention missing in this torch
        flex = None
    rows = []
    hq, d, dt = 32, 128, torch.bfloat16
    for hkv in (32, 8):
        for t in (1, 16, 64):
            tree = [list(p) for p in trees.kary(4, 3)][: t - 1]
            buf = trees.buffers(tree)
            mask = buf.attn_mask.cuda()
            bits = buf.mask_bits.cuda()
            for L in (512, 4096, 32768):
                q = torch.randn(1, hq, t, d, device="cuda", dtype=dt)
                k = torch.randn(1, hkv, L + t, d, device="cuda", dtype=dt)
                v = torch.randn_like(k)
                kv_bytes = 2 * hkv * (L + t) * d * 2
                floor_us = kv_bytes / bw * 1e6
                ours = triton.testing.do_bench(lambda: tree_attention(q, k, v, L, mask, mask_bits=bits),
                                               warmup=25, rep=100, return_mode="median") * 1e3
                dense = full_mask(L, mask, t, q.device, hq // hkv)
                sdpa = triton.testing.do_bench(lambda: sdpa_attention(q, k, v, L, mask, dense),
                                               warmup=25, rep=100, return_mode="median") * 1e3
                row = {"kv_heads": hkv, "T": t, "L": L, "ours_us": round(ours, 2), "sdpa_dense_us": round(sdpa, 2),
                       "floor_us": round(floor_us, 2), "ours_over_floor": round(ours / floor_us, 2),
                       "sdpa_over_ours": round(sdpa / ours, 2)}
                if flex is not None:
                    try:
                        def mask_mod(b, h, qi, kj):
                            col = kj - L
                            return (kj < L) | mask[qi, col.clamp(0, t - 1)]

                        bm = create_block_mask(mask_mod, 1, 1, t, L + t, device="cuda")
                        fx = triton.testing.do_bench(lambda: flex(q, k, v, block_mask=bm, enable_gqa=hkv != hq),
                                                     warmup=25, rep=100, return_mode="median") * 1e3
                        row["flex_us"] = round(fx, 2)
                    except Exception as e:  # report, do not hide, why flex could not run
                        row["flex_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                rows.append(row)
    out = {"copy_bandwidth_GBps": round(bw / 1e9, 1), "rows": rows}
    if markdown:
        lines = ["| KV heads | T | L | ours µs | SDPA dense µs | flex µs | floor µs | ours/floor | SDPA/ours |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['kv_heads']} | {r['T']} | {r['L']} | {r['ours_us']} | {r['sdpa_dense_us']} | "
                         f"{r.get('flex_us', '–')} | {r['floor_us']} | {r['ours_over_floor']} | {r['sdpa_over_ours']} |")
        out["markdown"] = "\n".join(lines)
    return out


def run_bench(a) -> int:
    import torch

    if a.part == "step":
        res = {"part": "step", "date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(),
               "torch": torch.__version__, **run_step(a.shapes.split(","), a.prefix, a.backend)}
        print(json.dumps(res))
        return 0
    if a.part == "attention":
        res = {"part": "attention", "date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(),
               "torch": torch.__version__, **run_attention(a.markdown)}
        print(json.dumps(res))
        if a.markdown:
            print(res["markdown"])
        return 0

    from . import load
    from .prompts import heldout_prompts

    if a.threads:
        torch.set_num_threads(a.threads)
    eng = load(a.model, device=a.device, dtype=a.dtype, backend=a.backend, cuda_graphs=a.cuda_graphs)
    prompts = heldout_prompts(a.offset + a.prompts)[a.offset:]
    result = {"part": a.part, "model": a.model, **_env(eng), "prompts": len(prompts), "max_new_tokens": a.max_new_tokens}
    if a.part == "e2e":
        result.update(run_e2e(eng, a.model, prompts, a.max_new_tokens, [t for t in a.trees.split(",") if t]))
    elif a.part == "batch":
        result.update(run_batch(eng, prompts, a.max_new_tokens, [int(b) for b in a.batches.split(",")],
                                [int(s) for s in a.sizes.split(",")], a.traces))
    else:
        result.update(run_latency(eng, prompts[:4], [int(s) for s in a.sizes.split(",")], a.traces))
    print(json.dumps(result))
    return 0
