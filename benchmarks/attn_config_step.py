"""Which tree-attention tile configuration the step gets, and what each would cost it (CUDA):
`PYTHONPATH=. python3 benchmarks/attn_config_step.py llama2-7b,smollm2-135m,demo`.

The kernel's autotuner times its configurations on the call it first meets, alone and with K/V hot in
L2, and keys the winner on the tile shape only; inside a step every layer reads its K/V from HBM. So
for each shape (random weights, `bench --part step`'s `random_pair`, graphs, fused kernels) this
prints one JSON line per setting: the autotuned choice (and the configuration it chose per tile
shape), then each configuration forced alone (one that needs more shared memory than the GPU has
says so), and the autotuned one with MIN_SPLIT 512. Each line
has the AR step and the 16- and 64-node tree steps (`bench.step.queued_ms`, best of three) and the
attention kernels' GPU time per step (`bench.step.kernel_breakdown`). Since 2026-12-07 an AR step's
attention (T = 1, bf16/fp16) runs `tree_attention.DECODE_CONFIG`, chosen from this script's runs, so a
forced configuration changes the tree steps only.
"""

from __future__ import annotations

import json
import sys

import torch
from triton.runtime.errors import OutOfResources

from engine.bench.step import best_queued_ms, random_heads, random_pair, step_kernels, step_runs
from engine.graphs import StepGraphs
from engine.kernels import tree_attention as ta

KERNEL = ta._tree_attn_split
TUNED = list(KERNEL.configs)


def describe(cfg) -> str:
    return f"{cfg.kwargs['BLOCK_N']}/{cfg.num_warps}w/{cfg.num_stages}s"


def measure(model, runs, prompt, setting: dict) -> dict:
    graphs = StepGraphs(model)
    rec = dict(setting)
    for run in runs:
        rec[f"{run[0]}_ms"] = round(best_queued_ms(graphs, model, run, prompt, iters=60, tries=3), 4)
        rec[f"{run[0]}_attention_ms"] = step_kernels(graphs, model, run, prompt)["by_kind"]["attention"]["ms"]
    rec["tree_64_over_ar"] = round(rec["tree_64_ms"] / rec["ar_ms"], 3)
    rec["chosen"] = {str(k): describe(c) for k, c in KERNEL.cache.items()}
    return rec


def main(shapes: list[str]) -> None:
    print(json.dumps({"device": torch.cuda.get_device_name()}), flush=True)
    for shape in shapes:
        hf, model = random_pair(shape, "triton", fused=True)
        heads = random_heads(hf.config.hidden_size)
        prefix = 1024 if shape.startswith("llama") else 256
        prompt = torch.randint(0, hf.config.vocab_size, (prefix,)).tolist()
        model.setup_cache(1, prefix + 1024)
        runs = step_runs(heads, (16, 64))
        settings = [({"config": "autotuned", "min_split": 256}, TUNED, 256)]
        settings += [({"config": describe(c), "min_split": 256}, [c], 256) for c in TUNED]
        settings.append(({"config": "autotuned", "min_split": 512}, TUNED, 512))
        for setting, configs, min_split in settings:
            KERNEL.configs, ta.MIN_SPLIT = configs, min_split
            KERNEL.cache.clear()
            try:
                rec = measure(model, runs, prompt, setting)
            except OutOfResources as e:  # the autotuner skips such a config; forced alone it cannot launch
                rec = {**setting, "error": str(e).split(".")[0]}
            print(json.dumps({"shape": shape, "prefix": prefix, **rec}), flush=True)
        KERNEL.configs, ta.MIN_SPLIT = TUNED, 256
        KERNEL.cache.clear()
        del hf, model, heads, runs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1].split(",") if len(sys.argv) > 1 else ["llama2-7b", "smollm2-135m", "demo"])
