"""Which tree-attention tile configuration the step gets, and what each would cost it (CUDA):
`PYTHONPATH=. python3 benchmarks/attn_config_step.py llama2-7b,smollm2-135m,demo`.

The kernel's autotuner times its configurations on the call it first meets, alone and with K/V hot in
L2, and keys the winner on the tile shape only; inside a step every layer reads its K/V from HBM. So
for each shape (random weights, `bench --part step`'s `random_pair`, graphs, fused kernels) this
prints one JSON line per setting: the autotuned choice (and the configuration it chose per tile
shape), then each configuration forced alone (one that needs more shared memory than the GPU has
says so), and the autotuned one with MIN_SPLIT 512. Each line
has the AR step and the 16- and 64-node tree steps (`bench.step.queued_ms`, best of three) and the
attention kernels' GPU time per step (`bench.step.kernel_breakdown`).
"""

from __future__ import annotations

import json
import sys

import torch
from triton.runtime.errors import OutOfResources

import trees
from engine.bench.step import HEAD_ACCURACY, kernel_breakdown, queued_ms, random_pair
from engine.decode import prefill
from engine.graphs import GREEDY, StepGraphs
from engine.heads import MedusaHeads
from engine.kernels import tree_attention as ta

KERNEL = ta._tree_attn_split
TUNED = list(KERNEL.configs)


def describe(cfg) -> str:
    return f"{cfg.kwargs['BLOCK_N']}/{cfg.num_warps}w/{cfg.num_stages}s"


def measure(model, heads, runs, prompt, setting: dict) -> dict:
    graphs = StepGraphs(model)
    rec = dict(setting)
    for name, h, buf, key in runs:
        rec[f"{name}_ms"] = round(min(queued_ms(graphs, h, buf, key, prefill(model, h, [prompt], GREEDY, None), iters=60)
                                      for _ in range(3)), 4)
        state = prefill(model, h, [prompt], GREEDY, None)
        rec[f"{name}_attention_ms"] = kernel_breakdown(lambda: graphs.step(h, buf, key, state))["by_kind"]["attention"]["ms"]
    rec["tree_64_over_ar"] = round(rec["tree_64_ms"] / rec["ar_ms"], 3)
    rec["chosen"] = {str(k): describe(c) for k, c in KERNEL.cache.items()}
    return rec


def main(shapes: list[str]) -> None:
    print(json.dumps({"device": torch.cuda.get_device_name()}), flush=True)
    for shape in shapes:
        hf, model = random_pair(shape, "triton", fused=True)
        heads = MedusaHeads(4, 1, hf.config.hidden_size, None).to("cuda", torch.bfloat16)
        with torch.no_grad():
            heads.weight.normal_(0, 0.01)
        prefix = 1024 if shape.startswith("llama") else 256
        prompt = torch.randint(0, hf.config.vocab_size, (prefix,)).tolist()
        model.setup_cache(1, prefix + 1024)
        runs = [("ar", None, None, None)]
        for n in (16, 64):
            tree = trees.best_tree_independent(HEAD_ACCURACY, n)
            runs.append((f"tree_{n}", heads, trees.buffers(tree, topk=10).to("cuda"), StepGraphs.tree_key(tree)))
        settings = [({"config": "autotuned", "min_split": 256}, TUNED, 256)]
        settings += [({"config": describe(c), "min_split": 256}, [c], 256) for c in TUNED]
        settings.append(({"config": "autotuned", "min_split": 512}, TUNED, 512))
        for setting, configs, min_split in settings:
            KERNEL.configs, ta.MIN_SPLIT = configs, min_split
            KERNEL.cache.clear()
            try:
                rec = measure(model, heads, runs, prompt, setting)
            except OutOfResources as e:  # the autotuner skips such a config; forced alone it cannot launch
                rec = {**setting, "error": str(e).split(".")[0]}
            print(json.dumps({"shape": shape, "prefix": prefix, **rec}), flush=True)
        KERNEL.configs, ta.MIN_SPLIT = TUNED, 256
        KERNEL.cache.clear()
        del hf, model, heads, runs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1].split(",") if len(sys.argv) > 1 else ["llama2-7b", "smollm2-135m", "demo"])
