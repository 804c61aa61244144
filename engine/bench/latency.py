"""bench --part latency: mean step time of real runs at each tree size (the input of
`trees optimize --latency`): best trees from AR traces (or chains), the AR point timed as the engine
runs AR (no heads), every size timed round-robin over prompts and rounds, step time = wall / steps
of whole runs (host work included), with means and 95 % intervals over rounds. With --traces, the
size `trees.select_size` picks from replayed E(n) and these step times is set against the measured
tokens/s of every size (is the chosen one the fastest, or within its interval?)."""

from __future__ import annotations

import trees

from ..generation import GenerationConfig
from .common import device_sync, engine_runner, mean_ci, round_robin, warm_up


def run_latency(eng, prompts: list[list[int]], cfg: GenerationConfig, sizes: list[int], traces: str | None,
                rounds: int) -> dict:
    runs = trees.ar_runs(trees.read_runs(traces)) if traces else None
    depth = eng.num_heads
    tree_of = {n: trees.best_tree(runs, n, max_depth=depth, time_limit=30) if runs else trees.chain(min(n, depth))
               for n in sizes}
    configs = {0: cfg.replace(mode="ar")} | {n: cfg.replace(mode="medusa", tree=t) for n, t in tree_of.items()}
    per_round_ms: dict[int, list[float]] = {n: [] for n in configs}
    per_round_tps: dict[int, list[float]] = {n: [] for n in configs}
    per_step: dict[int, float] = {}

    runners = {str(n): engine_runner(eng, c) for n, c in configs.items()}
    warm_up(runners, prompts)
    sync = device_sync(eng)
    for _ in range(rounds):  # one round at a time, so each round yields its own mean step time
        res = round_robin(runners, prompts, 1, sync)
        for n in configs:
            r = res[str(n)]
            per_round_ms[n].append(1000 * r["wall_s"] / r["steps"])
            per_round_tps[n].append(r["tokens"] / r["wall_s"])
            per_step[n] = r["tokens_per_step"]
    points = []
    for n in configs:
        ms, tps = mean_ci(per_round_ms[n]), mean_ci(per_round_tps[n])
        points.append({"nodes": n, "step_ms": ms["mean"], "ci95": ms["ci95"], "tokens_per_step": per_step[n],
                       "tokens_per_s": tps["mean"], "tokens_per_s_ci95": tps["ci95"]})
    out = {"rounds": rounds, "trees": {str(n): t for n, t in tree_of.items()},
           "tree_source": f"trees.best_tree (replay) on {traces}" if traces else "chains", "points": points}
    if runs:
        rp = trees.Replay(runs)
        choice = trees.select_size(lambda n: rp.tokens() / rp.steps({tuple(p) for p in tree_of[n]}),
                                   trees.latency_points({"points": points}))
        best = max(points, key=lambda p: p["tokens_per_s"])
        chosen = next(p for p in points if p["nodes"] == choice.nodes)
        lo = chosen["tokens_per_s_ci95"][0] if chosen["tokens_per_s_ci95"] else chosen["tokens_per_s"]
        hi = chosen["tokens_per_s_ci95"][1] if chosen["tokens_per_s_ci95"] else chosen["tokens_per_s"]
        out["size_choice"] = {"chosen": choice.nodes, "predicted_tokens_per_s": choice.tokens_per_s,
                              "margin_over_runner_up": choice.margin, "runner_up": choice.runner_up,
                              "measured_tokens_per_s": chosen["tokens_per_s"], "measured_ci95": chosen["tokens_per_s_ci95"],
                              "fastest_measured": best["nodes"], "fastest_tokens_per_s": best["tokens_per_s"],
                              "chosen_is_fastest_or_within_ci": best["nodes"] == choice.nodes or lo <= best["tokens_per_s"] <= hi
                              or best["tokens_per_s"] <= hi}
    return out
