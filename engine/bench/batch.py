"""bench --part batch: tokens/s of AR and Medusa at several batch sizes with trees of several sizes
(verification competes with the batch for compute, so the best tree shrinks as the batch grows).
Every batch size decodes the same mix of requests: each prompt lcm(prompts, b) / prompts times, in
consecutive batches of b. Had batch b run only the first b prompts, batch 1 would measure one prompt
and batch 32 another mix, and the sweep would compare prompts as much as batch sizes; cycling the
prompts only up to a whole number of batches would still run some twice and others once (12 prompts
in batches of 8). The cost is b / gcd(prompts, b) passes over the prompts: one pass when b divides
the prompt count, one batch when the prompt count divides b; each is run twice, the first untimed."""

from __future__ import annotations

import math
import time

import trees

from ..generation import GenerationConfig


def run_batch(eng, prompts: list[list[int]], cfg: GenerationConfig, batches: list[int], sizes: list[int],
              traces: str | None, tree_names: list[str] | None = None) -> dict:
    """Trees by name (`--trees`: a model's shipped trees), else one per size: the best from AR traces
    when given, else chains."""
    if tree_names:
        tree_of = {name: eng.resolve_tree(name) for name in tree_names}
    else:
        runs = trees.ar_runs(trees.read_runs(traces)) if traces else None
        tree_of = {str(n): trees.best_tree(runs, n) if runs else trees.chain(min(n, eng.num_heads)) for n in sizes}

    def run(batch, c):
        requests = [prompts[i % len(prompts)] for i in range(math.lcm(len(prompts), batch))]
        groups = [requests[i : i + batch] for i in range(0, len(requests), batch)]
        # warm-up: the whole pass, untimed. Requests of a batch finish at different steps, so the batch
        # shrinks through sizes whose graphs are captured on first use, and a longer prompt grows the
        # KV cache (every graph captured again); greedy runs repeat exactly, so the timed pass meets none.
        for group in groups:
            eng.generate(group, config=c)
        wall, steps, res = 0.0, 0, []
        for group in groups:
            t0 = time.perf_counter()
            out = eng.generate(group, config=c)
            wall += time.perf_counter() - t0
            steps += max(r.steps for r in out)
            res += out
        tokens = sum(r.new_tokens for r in res)
        return {"requests": len(res), "tokens": tokens, "steps": steps, "tokens_per_s": round(tokens / wall, 2),
                "tokens_per_step_per_request": round(tokens / sum(r.steps for r in res), 3)}, [r.token_ids for r in res]

    rows = []
    for b in batches:
        ar, ar_out = run(b, cfg.replace(mode="ar"))
        row = {"batch": b, "ar": ar, "medusa": {}}
        for n, tree in tree_of.items():
            m, m_out = run(b, cfg.replace(mode="medusa", tree=tree))
            m["speedup_vs_ar"] = round(m["tokens_per_s"] / ar["tokens_per_s"], 3)
            m["greedy_output_equals_ar"] = m_out == ar_out if cfg.accept == "greedy" else None
            row["medusa"][n] = m
        best = max(row["medusa"], key=lambda k: row["medusa"][k]["tokens_per_s"])
        row["best_tree"], row["best_nodes"] = best, len(tree_of[best])
        row["best_speedup"] = row["medusa"][best]["speedup_vs_ar"]
        rows.append(row)
    crossover = next((r["batch"] for r in rows if r["best_speedup"] < 1.0), None)
    return {"trees": tree_of, "rows": rows, "first_batch_where_ar_wins": crossover}
