"""bench --part latency: mean step time of real runs at each tree size (the input of
`trees optimize --latency`): best trees from AR traces (or chains), the AR point timed as the engine
runs AR (no heads), every size timed round-robin over prompts and rounds, step time = wall / steps
of whole runs (host work included), with means and 95 % intervals over rounds."""

from __future__ import annotations

import trees

from ..generation import GenerationConfig
from .common import mean_ci, round_robin


def run_latency(eng, prompts: list[list[int]], cfg: GenerationConfig, sizes: list[int], traces: str | None,
                rounds: int) -> dict:
    runs = trees.ar_runs(trees.read_runs(traces)) if traces else None
    tree_of = {n: trees.best_tree(runs, n) if runs else trees.chain(min(n, eng.num_heads)) for n in sizes}
    configs = {0: cfg.replace(mode="ar")} | {n: cfg.replace(mode="medusa", tree=t) for n, t in tree_of.items()}
    per_round_ms: dict[int, list[float]] = {n: [] for n in configs}

    def runner(n):
        def run(ids):
            r = eng.generate(ids, config=configs[n])
            return r.token_ids, r.steps
        return run

    runners = {str(n): runner(n) for n in configs}
    for run in runners.values():
        run(prompts[0])  # warm-up
    sync = (lambda: __import__("torch").cuda.synchronize()) if eng.device.type == "cuda" else (lambda: None)
    for _ in range(rounds):  # one round at a time, so each round yields its own mean step time
        res = round_robin(runners, prompts, 1, sync)
        for n in configs:
            r = res[str(n)]
            per_round_ms[n].append(1000 * r["wall_s"] / r["steps"])
    points = []
    for n in configs:
        ms = mean_ci(per_round_ms[n])
        points.append({"nodes": n, "step_ms": ms["mean"], "ci95": ms["ci95"]})
    return {"rounds": rounds, "trees": {str(n): t for n, t in tree_of.items()},
            "tree_source": f"trees.best_tree (replay) on {traces}" if traces else "chains", "points": points}
