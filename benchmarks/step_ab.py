"""Graphed greedy step times, for comparing two versions of the engine, or tree sizes, on one GPU
(CUDA): `PYTHONPATH=. python3 benchmarks/step_ab.py --shapes demo,smollm2-135m,llama2-7b --label new
[--sizes 16,32,64] [--min-split 256] [--no-attention] [--gemm auto]`.

Run it once from each checkout (the other one copied beside the repo), in turn, in one device call:
the numbers of two calls come from two machines. For each shape (random weights, `bench --part
step`'s `random_pair`, fused kernels, triton attention) it prints one JSON line: the AR step and the
tree steps of `--sizes` nodes besides the root (`bench.step.queued_ms`: 100 queued replays, best of
three prefills) at a prefix of 256 (1,024 for the 7B/8B shapes), their ratios to AR, the AR step over
the weight-read floor (copy bandwidth measured in the run, as `bench --part step`), and the kernels
of each replay with their GPU time by kind (`bench.step.kernel_breakdown`; the files
`step_sizes_h100_2026-12-06.jsonl` and `attention_merge_ab_h100_2026-12-06.jsonl` hold only the AR's
and the largest tree's: the script profiled those alone then).
Then, unless `--no-attention`, the attention kernel alone at 7B heads (32 query heads, D 128, MHA
and GQA 4:1) at T 1 / 16 / 64 over prefixes of 1,024 and 4,096, µs per call replayed from a CUDA
graph (`bench.attention.graph_us`: the same K/V every call, so from L2 where it fits; a step reads
each layer's from HBM). `--min-split` replaces the kernel's MIN_SPLIT before anything runs; `--gemm`
is the model's GEMM choice (engine/gemm_choice.py; what `auto` chose is recorded, as are the attention
kernel's autotuned configurations, chosen per process).
"""

from __future__ import annotations

import argparse
import inspect
import json

import torch

import trees
from engine.bench.attention import graph_us
from engine.bench.common import copy_bandwidth
from engine.bench.step import best_queued_ms, random_heads, random_pair, step_kernels, step_runs, weight_bytes
from engine.gemm_choice import GEMMS
from engine.graphs import StepGraphs
from engine.kernels import tree_attention as ta

BIG = ("llama2-7b", "llama3-8b")


def step_times(shape: str, label: str, sizes: list[int], gemm: str) -> dict:
    hf, model = random_pair(shape, "triton", fused=True, gemm=gemm)
    heads = random_heads(hf.config.hidden_size)
    prefix = 1024 if shape in BIG else 256
    prompt = torch.randint(0, hf.config.vocab_size, (prefix,)).tolist()
    model.setup_cache(1, prefix + 1024)
    graphs = StepGraphs(model)
    floor_ms = weight_bytes(hf) / copy_bandwidth() * 1e3  # as `bench --part step`
    rec = {"label": label, "shape": shape, "prefix": prefix, "gemm": gemm, "weight_floor_ms": round(floor_ms, 3)}
    for run in step_runs(heads, sizes):
        rec[f"{run[0]}_ms"] = round(best_queued_ms(graphs, model, run, prompt, iters=100, tries=3), 4)
        rec[f"{run[0]}_kernels"] = step_kernels(graphs, model, run, prompt)
    rec["ar_over_floor"] = round(rec["ar_ms"] / floor_ms, 3)
    for n in sizes:
        rec[f"tree_{n}_over_ar"] = round(rec[f"tree_{n}_ms"] / rec["ar_ms"], 3)
    if model.gemm_choice is not None:
        rec["gemm_choice"] = model.gemm_choice.chosen()
    rec["attention_configs"] = {str(key): str(cfg) for key, cfg in ta._tree_attn_split.cache.items()}  # autotuned per process
    rec["decode_attention_config"] = ta.DECODE_CONFIG  # T = 1 (bf16/fp16, D <= 128): fixed, not autotuned
    return rec


def attention_times(label: str) -> dict:
    kept = "arrivals" in inspect.signature(ta.tree_attention).parameters  # the version before had none
    rec = {"label": label, "part": "attention_us"}
    for hkv in (32, 8):
        for t in (1, 16, 64):
            tree = [list(p) for p in trees.kary(4, 3)][: t - 1]
            block = trees.buffers(tree).attn_mask if t > 1 else torch.ones(1, 1, dtype=torch.bool)
            bits = trees.pack_mask_bits(block).cuda()
            for L in (1024, 4096):
                q = torch.randn(1, 32, t, 128, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(1, hkv, L + t, 128, device="cuda", dtype=torch.bfloat16)
                v = torch.randn_like(k)
                start = torch.tensor([L], device="cuda")
                extra = {"arrivals": ta.arrival_counters(1, hkv, "cuda")} if kept else {}
                rec[f"{hkv}/{t}/{L}"] = round(graph_us(lambda: ta.tree_attention(q, k, v, start, tree_bits=bits, **extra)), 2)
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="demo,smollm2-135m")
    ap.add_argument("--label", default="")
    ap.add_argument("--sizes", default="16,32,64", help="tree sizes, nodes besides the root")
    ap.add_argument("--min-split", type=int, default=ta.MIN_SPLIT)
    ap.add_argument("--no-attention", action="store_true")
    ap.add_argument("--gemm", default="cublas", choices=GEMMS)
    a = ap.parse_args()
    ta.MIN_SPLIT = a.min_split
    print(json.dumps({"label": a.label, "device": torch.cuda.get_device_name(), "min_split": a.min_split}), flush=True)
    if not a.no_attention:
        print(json.dumps(attention_times(a.label)), flush=True)
    for shape in a.shapes.split(","):
        print(json.dumps(step_times(shape, a.label, [int(n) for n in a.sizes.split(",")], a.gemm)), flush=True)
        torch.cuda.empty_cache()  # the shape's models went with step_times' frame


if __name__ == "__main__":
    main()
