"""Tree attention's split policy seen from the whole step (CUDA): `PYTHONPATH=. python3
benchmarks/attn_step_sweep.py [--shapes demo,smollm2-135m] [--sizes 64] [--prefixes 256,64]
[--settings 256:128,128:128,...]`.

`attn_split_sweep.py` times the kernel alone at 7B-like heads; here the question is what a setting
does to the graphed, fused greedy step. For each shape (random weights, `bench --part step`'s
`random_pair`), prefix and (MIN_SPLIT, row-tile cap) setting it prints one JSON line: the AR step and
the tree steps of `--sizes` nodes (`bench.step.queued_ms`: 100 queued replays, best of two
prefills) and their ratios to AR. A setting is applied by replacing the module's MIN_SPLIT and
ROW_CAP before the graphs are captured (until 2026-12-06 by capping its `block_rows`, whose own cap
was then 128). The question of 2026-12-06 (benchmarks/README.md, "Row tiles of 64"): `--shapes
llama2-7b,llama3-8b,smollm2-135m,demo --sizes 16,32,63,64,128 --prefixes 1024 --settings 256:128,256:64`.
"""

from __future__ import annotations

import argparse
import json

import torch

from engine.bench.step import best_queued_ms, random_heads, random_pair, step_runs
from engine.graphs import StepGraphs
from engine.kernels import tree_attention as ta

SETTINGS = "256:128,128:128,64:128,128:64,64:64,64:32"  # MIN_SPLIT:row-tile cap


def main(shapes: list[str], sizes: list[int], prefixes: list[int], settings: list[tuple[int, int]]) -> None:
    default_cap, default_split = ta.ROW_CAP, ta.MIN_SPLIT
    for shape in shapes:
        hf, model = random_pair(shape, "triton", fused=True)
        runs = step_runs(random_heads(hf.config.hidden_size), sizes)
        for prefix in prefixes:
            prompt = torch.randint(0, hf.config.vocab_size, (prefix,)).tolist()
            model.setup_cache(1, prefix + 1024)
            for min_split, cap in settings:
                ta.MIN_SPLIT, ta.ROW_CAP = min_split, cap
                graphs = StepGraphs(model)
                rec = {"shape": shape, "prefix": prefix, "min_split": min_split, "row_cap": cap}
                for run in runs:
                    rec[f"{run[0]}_ms"] = round(best_queued_ms(graphs, model, run, prompt, iters=100, tries=2), 4)
                for n in sizes:
                    rec[f"tree_{n}_over_ar"] = round(rec[f"tree_{n}_ms"] / rec["ar_ms"], 3)
                print(json.dumps(rec), flush=True)
            model.cache = None
        ta.MIN_SPLIT, ta.ROW_CAP = default_split, default_cap
        hf = model = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="demo,smollm2-135m")
    ap.add_argument("--sizes", default="64")
    ap.add_argument("--prefixes", default="256,64")
    ap.add_argument("--settings", default=SETTINGS, help="MIN_SPLIT:row-tile cap, comma-separated")
    a = ap.parse_args()
    main(a.shapes.split(","), [int(n) for n in a.sizes.split(",")], [int(n) for n in a.prefixes.split(",")],
         [tuple(int(v) for v in s.split(":")) for s in a.settings.split(",")])
