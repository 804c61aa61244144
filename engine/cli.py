"""`python -m engine generate|bench|train-heads|eval-heads|build-demo-corpus|train-base|...`."""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _tensor_parallel(a):
    """--tp N under torchrun: join the group (every rank runs the same decode; rank 0 prints)."""
    from .tp import SINGLE, init_from_env

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if a.tp == 1 and "TORCHELASTIC_RUN_ID" not in os.environ:  # not under torchrun: no process group
        return SINGLE, a.device
    if a.tp != world:
        raise ValueError(f"--tp {a.tp} needs exactly {a.tp} processes (torchrun --nproc-per-node {a.tp}); "
                         f"WORLD_SIZE is {world}")
    import torch

    kind = (a.device or ("cuda" if torch.cuda.is_available() else "cpu")).split(":")[0]
    return init_from_env(kind)


def _ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None


def _generate(a) -> int:
    from . import load

    tp, device = _tensor_parallel(a)
    eng = load(a.model, heads=False if a.no_heads else a.heads, device=device, dtype=a.dtype,
               max_seq_len=a.max_seq_len, backend=a.backend, tp=tp, cuda_graphs=a.cuda_graphs)
    prompt = a.prompt if a.prompt_ids is None else _ids(a.prompt_ids)
    tree = a.tree
    if tree and tree.lstrip().startswith(("[", "{")):  # inline tree JSON (never evaluated as Python)
        try:
            tree = json.loads(tree)
        except json.JSONDecodeError as e:
            raise ValueError(f"--tree: not valid JSON ({e.msg} at column {e.colno})") from None
    res = eng.generate(prompt, a.max_new_tokens, mode=a.mode, tree=tree, accept=a.accept,
                       temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, seed=a.seed, chat=a.chat,
                       trace_file=a.trace if tp.rank == 0 else None)
    if tp.rank != 0:
        return 0
    if a.json:
        print(json.dumps(res.to_json()))
    else:
        print(res.text)
        print(f"[{res.new_tokens} tokens, {res.steps} steps, {res.mean_accepted:.2f} tokens/step, "
              f"{res.tokens_per_s:.1f} tokens/s, {res.finish_reason}]", file=sys.stderr)
    return 0


def _train_heads(a) -> int:
    from .train_heads import train_heads

    rep = train_heads(a.model, a.data, a.out, num_heads=a.heads, num_layers=a.layers,
                      shared_lm_head=not a.private_proj, steps=a.steps, minutes=a.minutes, batch=a.batch,
                      seq=a.seq, lr=a.lr, eval_every=a.eval_every, self_distill=a.self_distill, distill_batch=a.distill_batch,
                      heldout=a.heldout, device=a.device,
                      resume=not a.no_resume)
    print(json.dumps({k: rep[k] for k in ("steps", "seconds", "heldout", "out")}))
    return 0


def _eval_heads(a) -> int:
    from .train_heads import eval_heads

    print(json.dumps(eval_heads(a.model, a.data, a.heads, seq=a.seq, batch=a.batch, n_batches=a.batches, device=a.device)))
    return 0


def _build_corpus(a) -> int:
    from .corpus import build

    print(json.dumps(build(a.out, vocab_size=a.vocab_size)))
    return 0


def _train_base(a) -> int:
    from .train_base import train_base

    rep = train_base(a.data, a.out, minutes=a.minutes, steps=a.steps, batch=a.batch, seq=a.seq, lr=a.lr, device=a.device,
                     future_heads=a.future_heads, future_weight=a.future_weight)
    print(json.dumps({k: v for k, v in rep.items() if k != "history"}))
    return 0


def _inspect(a) -> int:
    from .convert import inspect

    info = inspect(a.path, a.model)
    if a.json:
        print(json.dumps(info))
        return 0
    for section in ("base", "heads"):
        if info.get(section):
            print(f"{section}:")
            for k, v in info[section].items():
                print(f"  {k}: {v}")
    for problem in info.get("mismatch", []):
        print(f"mismatch: {problem}")
    if info.get("note"):
        print(info["note"])
    return 1 if info.get("mismatch") else 0


def _convert(a) -> int:
    from .convert import convert

    print(json.dumps(convert(a.src, a.to, a.out, model=a.model, dtype=a.dtype, allow_lossy=a.allow_lossy, tp=a.tp,
                             data=a.data)))
    return 0


def _collect(a) -> int:
    from . import load
    from .prompts import heldout_prompts

    eng = load(a.model, device=a.device)
    prompts = heldout_prompts(a.offset + a.prompts)[a.offset:]
    steps = 0
    for p in prompts:  # AR runs with traces record every head's top-k: all the optimiser needs
        steps += eng.generate(p, a.max_new_tokens, mode="ar", trace_file=a.out).steps
    print(json.dumps({"out": a.out, "prompts": len(prompts), "steps": steps}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="decode a prompt (AR or Medusa) and print text or JSON")
    g.add_argument("--model", default="demo", help="model directory, a cached hub id, or 'demo'")
    g.add_argument("--heads", default=None, help="heads file (default: found beside the model)")
    g.add_argument("--no-heads", action="store_true")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--prompt-ids", help="comma-separated token ids (models without a tokenizer)")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--mode", choices=["ar", "medusa"], default="medusa")
    g.add_argument("--tree", default=None, help="preset name, tree JSON file, or inline JSON (default: the project's default)")
    g.add_argument("--accept", choices=["greedy", "typical", "sample"], default="greedy")
    g.add_argument("--temperature", type=float, default=0.7)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    g.add_argument("--device", default=None)
    g.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    g.add_argument("--max-seq-len", type=int, default=None)
    g.add_argument("--backend", default="sdpa", choices=["sdpa", "triton"])
    g.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="replay greedy steps from CUDA graphs (default: on when the device is CUDA)")
    g.add_argument("--trace", default=None, metavar="FILE.jsonl", help="write one JSON line per step")
    g.add_argument("--json", action="store_true")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (launch with torchrun --nproc-per-node N)")
    g.set_defaults(fn=_generate)

    t = sub.add_parser("train-heads", help="train Medusa heads on a frozen base model")
    t.add_argument("--model", required=True)
    t.add_argument("--data", required=True, help="token file (.bin uint16 / .npy) or text file/folder")
    t.add_argument("--out", required=True)
    t.add_argument("--heldout", default=None, help="held-out data for the accuracy reports (default: last 2%% of --data)")
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--layers", type=int, default=1, help="ResBlocks per head")
    t.add_argument("--private-proj", action="store_true", help="own vocab projection per head (FasterDecoding)")
    t.add_argument("--steps", type=int, default=None)
    t.add_argument("--minutes", type=float, default=None, help="time budget when --steps is not given")
    t.add_argument("--batch", type=int, default=32)
    t.add_argument("--seq", type=int, default=512)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--eval-every", type=int, default=200)
    t.add_argument("--self-distill", type=int, default=0, metavar="N",
                   help="train on N greedy continuations written by the base model itself (Medusa-2's advice)")
    t.add_argument("--distill-batch", type=int, default=256, help="continuations generated together")
    t.add_argument("--no-resume", action="store_true")
    t.add_argument("--device", default=None)
    t.set_defaults(fn=_train_heads)

    e = sub.add_parser("eval-heads", help="per-head top-1/top-5 accuracy on a token file or text")
    e.add_argument("--model", default="demo")
    e.add_argument("--heads", default=None, help="heads file (default: found beside the model)")
    e.add_argument("--data", required=True, help="token file (.bin uint16 / .npy) or text file/folder")
    e.add_argument("--seq", type=int, default=256)
    e.add_argument("--batch", type=int, default=16)
    e.add_argument("--batches", type=int, default=4)
    e.add_argument("--device", default=None)
    e.set_defaults(fn=_eval_heads)

    c = sub.add_parser("build-demo-corpus", help="rebuild the demo corpus and tokenizer offline")
    c.add_argument("--out", default="data/demo")
    c.add_argument("--vocab-size", type=int, default=8192)
    c.set_defaults(fn=_build_corpus)

    b = sub.add_parser("train-base", help="train the demo base model from scratch")
    b.add_argument("--data", default="data/demo")
    b.add_argument("--out", required=True)
    b.add_argument("--minutes", type=float, default=5.0)
    b.add_argument("--steps", type=int, default=None, help="fixed step count (overrides --minutes)")
    b.add_argument("--batch", type=int, default=64)
    b.add_argument("--seq", type=int, default=1024)
    b.add_argument("--lr", type=float, default=2e-3)
    b.add_argument("--future-heads", type=int, default=0, metavar="K",
                   help="also train K throwaway future-token heads with the base (their loss shapes its hidden "
                        "states); the shipped Medusa heads are trained afterwards on the frozen base")
    b.add_argument("--future-weight", type=float, default=0.2, help="weight of the future-token loss")
    b.add_argument("--device", default=None)
    b.set_defaults(fn=_train_base)

    k = sub.add_parser("collect-traces", help="decode held-out prompts with traces (input for `trees optimize`)")
    k.add_argument("--model", default="demo")
    k.add_argument("--prompts", type=int, default=12)
    k.add_argument("--offset", type=int, default=0)
    k.add_argument("--max-new-tokens", type=int, default=128)
    k.add_argument("--device", default=None)
    k.add_argument("--out", required=True)
    k.set_defaults(fn=_collect)

    i = sub.add_parser("inspect", help="what a model directory, heads file or Medusa-2 checkpoint holds")
    i.add_argument("path")
    i.add_argument("--model", default=None, help="check the heads against this base model")
    i.add_argument("--json", action="store_true")
    i.set_defaults(fn=_inspect)

    from .convert import TARGETS

    v = sub.add_parser("convert-heads", help="convert Medusa heads between formats (safetensors only)")
    v.add_argument("src")
    v.add_argument("--to", required=True, choices=TARGETS)
    v.add_argument("--out", required=True)
    v.add_argument("--model", default=None, help="base model (needed to add or drop projections, and for medusa2)")
    v.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"])
    v.add_argument("--allow-lossy", action="store_true")
    v.add_argument("--data", default=None, help="held-out data: report top-1 before/after a lossy conversion")
    v.add_argument("--tp", type=int, default=1, help="write per-rank tensor-parallel shards")
    v.set_defaults(fn=_convert)

    from .bench import add_bench_args

    add_bench_args(sub.add_parser("bench", help="measure and print JSON"))
    return p


def main(argv: list[str] | None = None) -> int:
    from trees import TreeError

    from . import GenerationError, ModelLoadError

    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (GenerationError, ModelLoadError, TreeError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
