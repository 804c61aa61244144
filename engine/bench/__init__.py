"""`python -m engine bench --part e2e|batch|latency|step|attention`: measurements printed as JSON
(recorded runs and the exact commands live in benchmarks/README.md). Every part that compares
modes times them round-robin over prompts and rounds.

  e2e        tokens/s and tokens/step of our AR, Medusa with each --trees entry and `transformers`
             generate on the same prompts; greedy Medusa output checked equal to AR's (bench/e2e.py)
  batch      AR and Medusa at several batch sizes and tree sizes (bench/batch.py)
  latency    mean step time per tree size from real runs: `trees optimize --latency` (bench/latency.py)
  parity     our greedy output against `transformers` on the same weights, divergences judged (bench/parity.py)
  step       (CUDA) one step at 7B/8B shapes against the weight-read floor (bench/step.py)
  --shape    (e2e and batch) a random-weight model of a real shape with oracle drafts (bench/oracle.py)
  attention  (CUDA) our tree-attention kernel against SDPA and flex_attention (bench/attention.py)
"""

from __future__ import annotations

import argparse
import json
import os

from ..options import add_generation_arguments, add_model_arguments, add_prompt_set_arguments, positive_int


def _threads(text: str) -> int:
    """CPU threads: 1 .. this machine's CPU count (more only slows a benchmark; 10**9 once reached torch)."""
    n, most = positive_int(text), os.cpu_count() or 1
    if n > most:
        raise argparse.ArgumentTypeError(f"this machine has {most} CPUs; --threads {n} is more")
    return n


def _list(text: str) -> list[int]:
    return [positive_int(x) for x in text.split(",") if x.strip()]


def add_bench_arguments(p) -> None:
    p.add_argument("--part", choices=["e2e", "batch", "latency", "parity", "attention", "step"], default="e2e")
    add_model_arguments(p)
    add_prompt_set_arguments(p, count=12, offset=12)
    add_generation_arguments(p, exclude=("mode", "tree", "trace_file", "trace_heads"))
    p.add_argument("--trees", default=None, help="e2e (default demo_tuned,chain_4,mc_sim_7b_63) and batch (default: "
                   "a tree per --sizes entry): comma-separated presets or files")
    p.add_argument("--rounds", type=positive_int, default=3, help="e2e/latency: round-robin repeats")
    p.add_argument("--no-transformers", action="store_true", help="e2e: leave out the transformers peer")
    p.add_argument("--traced", action="store_true", help="e2e: also time traced runs (what the workbench runs)")
    p.add_argument("--traces", default=None, help="latency/batch: AR traces for the trees (default: chains)")
    p.add_argument("--sizes", type=_list, default=[4, 8, 12, 16, 24, 32, 48, 63, 64],
                   help="latency/batch: tree sizes (63 and 64 both: past 64 tokens a GPU step costs more)")
    p.add_argument("--batches", type=_list, default=[1, 2, 4, 8], help="batch: batch sizes")
    p.add_argument("--shapes", default="llama2-7b,llama3-8b", help="step: model shapes (llama2-7b, llama3-8b, smollm2-135m, demo)")
    p.add_argument("--shape", default=None, help="e2e, batch: a random-weight model of this shape (llama2-7b, llama3-8b, "
                   "smollm2-135m, demo) with oracle drafts, instead of --model")
    p.add_argument("--prompt-len", type=positive_int, default=128, help="--shape: random prompt tokens")
    p.add_argument("--prefix", type=positive_int, default=1024, help="step: committed tokens before the timed steps")
    p.add_argument("--markdown", action="store_true", help="attention: also print a markdown table")
    p.add_argument("--threads", type=_threads, default=None, help="torch CPU threads")
    p.set_defaults(fn=run_bench)


def run_bench(a) -> int:
    import time

    import torch

    from ..options import config_from_arguments, load_from_arguments
    from ..prompts import prompt_set
    from .common import env, fit_prompts

    tree_names = [t for t in (a.trees or "demo_tuned,chain_4,mc_sim_7b_63").split(",") if t]
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.part in ("e2e", "batch") and a.shape:
        device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
        cuda = device.startswith("cuda")
        if cuda and not torch.cuda.is_available():
            raise ValueError(f"bench --part {a.part} --shape: --device {device}, but no CUDA device is available")
        cfg = config_from_arguments(a)
        backend, dtype = a.backend or ("triton" if cuda else "sdpa"), a.dtype or ("bfloat16" if cuda else "float32")
        if not cuda and backend != "sdpa":
            raise ValueError(f"bench --shape on the CPU runs --backend sdpa (not {backend})")
        if a.part == "e2e":
            from .e2e import run_e2e_shape

            res = run_e2e_shape(a.shape, tree_names, a.prompts or 4, a.prompt_len, cfg.max_new_tokens, a.rounds,
                                backend, a.gemm, dtype, device)
        else:
            from .batch import run_batch
            from .oracle import oracle_engine

            _, eng, ids, about = oracle_engine(a.shape, a.prompts or 4, a.prompt_len, cfg.max_new_tokens,
                                               backend, a.gemm, dtype, device)
            res = {**about, **run_batch(eng, ids, cfg, a.batches, a.sizes, None,
                                        tree_names if a.trees else None)}
        print(json.dumps({"part": a.part, "date": time.strftime("%Y-%m-%d"),
                          "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__, **res}))
        return 0
    if a.part in ("step", "attention"):
        if not torch.cuda.is_available():
            raise ValueError(f"bench --part {a.part} needs a CUDA device")
        head = {"part": a.part, "date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(),
                "torch": torch.__version__}
        if a.part == "step":
            from .step import run_step

            print(json.dumps({**head, **run_step(a.shapes.split(","), a.prefix, a.backend or "triton")}))
        else:
            from .attention import run_attention

            res = {**head, **run_attention(a.markdown)}
            print(json.dumps(res))
            if a.markdown:
                print(res["markdown"])
        return 0
    cfg = config_from_arguments(a)
    eng = load_from_arguments(a)
    texts = [p.text for p in prompt_set(a.prompts_file, a.prompts, a.offset, a.default_prompts, a.default_offset)]
    prompts, cut = fit_prompts(eng, texts, cfg.max_new_tokens, eng.resolved(cfg).chat)
    result = {"part": a.part, "model": a.model, **env(eng), "prompts": len(prompts), "prompts_cut_to_fit": cut,
              "prompts_file": a.prompts_file, "max_new_tokens": cfg.max_new_tokens, "stop_on_eos": cfg.stop_on_eos,
              "accept": cfg.accept, "chat": eng.resolved(cfg).chat}
    if a.part == "parity":
        from .parity import run_parity

        result.update(run_parity(eng, prompts, cfg.max_new_tokens, cfg.stop_on_eos))
    elif a.part == "e2e":
        from .e2e import run_e2e

        result.update(run_e2e(eng, prompts, cfg, tree_names, a.rounds,
                              not a.no_transformers, a.traced))
    elif a.part == "batch":
        from .batch import run_batch

        result.update(run_batch(eng, prompts, cfg, a.batches, a.sizes, a.traces, tree_names if a.trees else None))
    else:
        from .latency import run_latency

        result.update(run_latency(eng, prompts, cfg, a.sizes, a.traces, a.rounds))
    print(json.dumps(result))
    return 0
