"""bench --part batch: tokens/s of AR and Medusa at several batch sizes with trees of several sizes
(verification competes with the batch for compute, so the best tree shrinks as the batch grows)."""

from __future__ import annotations

import time

import trees

from ..generation import GenerationConfig


def run_batch(eng, prompts: list[list[int]], cfg: GenerationConfig, batches: list[int], sizes: list[int],
              traces: str | None) -> dict:
    runs = trees.ar_runs(trees.read_runs(traces)) if traces else None
    tree_of = {n: trees.best_tree(runs, n) if runs else trees.chain(min(n, eng.num_heads)) for n in sizes}

    def run(batch, c):
        group = [prompts[i % len(prompts)] for i in range(batch)]
        eng.generate(group, config=c)  # warm-up: every batch size the run passes through
        t0 = time.perf_counter()
        res = eng.generate(group, config=c)
        wall = time.perf_counter() - t0
        tokens = sum(r.new_tokens for r in res)
        return {"tokens": tokens, "steps": max(r.steps for r in res), "tokens_per_s": round(tokens / wall, 2),
                "tokens_per_step_per_request": round(tokens / sum(r.steps for r in res), 3)}, [r.token_ids for r in res]

    rows = []
    for b in batches:
        ar, ar_out = run(b, cfg.replace(mode="ar"))
        row = {"batch": b, "ar": ar, "medusa": {}}
        for n, tree in tree_of.items():
            m, m_out = run(b, cfg.replace(mode="medusa", tree=tree))
            m["speedup_vs_ar"] = round(m["tokens_per_s"] / ar["tokens_per_s"], 3)
            m["greedy_output_equals_ar"] = m_out == ar_out if cfg.accept == "greedy" else None
            row["medusa"][str(n)] = m
        best = max(row["medusa"], key=lambda k: row["medusa"][k]["tokens_per_s"])
        row["best_nodes"], row["best_speedup"] = int(best), row["medusa"][best]["speedup_vs_ar"]
        rows.append(row)
    crossover = next((r["batch"] for r in rows if r["best_speedup"] < 1.0), None)
    return {"trees": {str(n): t for n, t in tree_of.items()}, "rows": rows, "first_batch_where_ar_wins": crossover}
