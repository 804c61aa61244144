"""Tree attention's split policy seen from the whole step (CUDA): `PYTHONPATH=. python3
benchmarks/attn_step_sweep.py demo,smollm2-135m`.

`attn_split_sweep.py` times the kernel alone at 7B-like heads; at the demo's and SmolLM2's sizes the
question is what a setting does to the graphed, fused greedy step. For each shape (random weights,
`bench --part step`'s `random_pair`), prefix (256, 64) and (MIN_SPLIT, row-tile cap) it prints one
JSON line: the AR step and the 64-node tree step (`bench.step.queued_ms`: 100 queued replays, best of
two prefills) and their ratio. A setting is applied by replacing the module's constant and its
`block_rows` before the graphs are captured.
"""

from __future__ import annotations

import json
import sys

import torch

from engine.bench.step import best_queued_ms, random_heads, random_pair, step_runs
from engine.graphs import StepGraphs
from engine.kernels import tree_attention as ta

SETTINGS = ((256, 128), (128, 128), (64, 128), (128, 64), (64, 64), (64, 32))  # (MIN_SPLIT, row-tile cap)


def capped(default_rows, cap: int):
    return lambda rows, dtype: min(cap, default_rows(rows, dtype))


def main(shapes: list[str]) -> None:
    default_rows, default_split = ta.block_rows, ta.MIN_SPLIT
    for shape in shapes:
        hf, model = random_pair(shape, "triton", fused=True)
        runs = step_runs(random_heads(hf.config.hidden_size), (64,))
        for prefix in (256, 64):
            prompt = torch.randint(0, hf.config.vocab_size, (prefix,)).tolist()
            model.setup_cache(1, prefix + 1024)
            for min_split, cap in SETTINGS:
                ta.MIN_SPLIT, ta.block_rows = min_split, capped(default_rows, cap)
                graphs = StepGraphs(model)
                rec = {"shape": shape, "prefix": prefix, "min_split": min_split, "row_cap": cap}
                for run in runs:
                    rec[f"{run[0]}_ms"] = round(best_queued_ms(graphs, model, run, prompt, iters=100, tries=2), 4)
                rec["tree_64_over_ar"] = round(rec["tree_64_ms"] / rec["ar_ms"], 3)
                print(json.dumps(rec), flush=True)
            model.cache = None
        ta.MIN_SPLIT, ta.block_rows = default_split, default_rows
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1].split(",") if len(sys.argv) > 1 else ["demo", "smollm2-135m"])
