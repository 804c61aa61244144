"""`python -m engine bench`: measurements printed as JSON (recorded runs live in benchmarks/).

Parts:
  e2e      tokens/s and tokens/step of AR and Medusa (each --trees entry) on held-out prompts, with
           the check that greedy Medusa output equals AR output on every prompt
  latency  mean tree-step latency for best-first trees of several sizes (feeds `trees optimize --latency`)
"""

from __future__ import annotations

import json
import platform
import time


def add_bench_args(p) -> None:
    p.add_argument("--part", choices=["e2e", "latency"], default="e2e")
    p.add_argument("--model", default="demo")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
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


def run_e2e(eng, prompts, max_new, tree_names) -> dict:
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
    out = {"ar": ar, "medusa": {}}
    for name in tree_names:
        m, m_out = run("medusa", name)
        m["nodes"] = len(eng.resolve_tree(name))
        m["speedup_vs_ar"] = round(m["tokens_per_s"] / ar["tokens_per_s"], 3)
        m["greedy_output_equals_ar"] = m_out == ar_out
        out["medusa"][name] = m
    return out


def run_latency(eng, prompts, sizes, traces) -> dict:
    import trees

    vec = trees.rank_vectors_from_file(traces) if traces else None
    curve = []
    for n in sizes:
        tree = trees.best_tree_empirical(vec, n) if vec else trees.chain(min(n, eng.num_heads))
        tokens = steps = 0
        ms = 0.0
        for p in prompts:
            r = eng.generate(p, 64, mode="medusa", tree=tree, trace=True)
            steps += r.steps
            tokens += r.new_tokens
            ms += sum(t["step_ms"] for t in r.traces)
        curve.append({"nodes": n, "step_ms": round(ms / steps, 3), "tokens_per_step": round(tokens / steps, 3)})
    ar = eng.generate(prompts[0], 64, mode="ar", trace=True)
    return {"ar_step_ms": round(sum(t["step_ms"] for t in ar.traces) / ar.steps, 3), "curve": curve,
            "latency_points": [[1, round(sum(t["step_ms"] for t in ar.traces) / ar.steps, 3)]]
            + [[c["nodes"] + 1, c["step_ms"]] for c in curve]}


def run_bench(a) -> int:
    import torch

    from . import load
    from .prompts import heldout_prompts

    if a.threads:
        torch.set_num_threads(a.threads)
    eng = load(a.model, device=a.device, dtype=a.dtype)
    prompts = heldout_prompts(a.offset + a.prompts)[a.offset:]
    result = {"part": a.part, "model": a.model, **_env(eng), "prompts": len(prompts), "max_new_tokens": a.max_new_tokens}
    if a.part == "e2e":
        result.update(run_e2e(eng, prompts, a.max_new_tokens, [t for t in a.trees.split(",") if t]))
    else:
        result.update(run_latency(eng, prompts[:4], [int(s) for s in a.sizes.split(",")], a.traces))
    print(json.dumps(result))
    return 0
