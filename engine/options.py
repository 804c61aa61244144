"""Command-line options declared once: how to load a model, and every GenerationConfig field.

`python -m engine generate|collect-traces|bench|spec-bench` and `app.py` add these to their parsers,
so a flag means the same thing (and is checked the same way) everywhere.
"""

from __future__ import annotations

import argparse
import dataclasses

from .attention import BACKENDS
from .gemm_choice import GEMMS
from .generation import GenerationConfig


def _int_at_least(text: str, low: int, what: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {v}")
    return v


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def nonneg_int(text: str) -> int:
    return _int_at_least(text, 0, "an integer >= 0")


def add_model_arguments(p: argparse.ArgumentParser, heads: bool = True) -> None:
    p.add_argument("--model", default="demo", help="model directory, a cached hub id, or 'demo'")
    if heads:
        p.add_argument("--heads", default=None, help="heads file (default: found beside the model)")
        p.add_argument("--no-heads", action="store_true", help="load no Medusa heads")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda when available)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--backend", default=None, choices=BACKENDS,
                   help="attention backend (default: triton on CUDA, sdpa elsewhere)")
    p.add_argument("--max-seq-len", type=positive_int, default=None, help="cap the context (default: the model's)")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="replay greedy steps from CUDA graphs with fused kernels (default: on with CUDA)")
    p.add_argument("--gemm", default="cublas", choices=GEMMS,
                   help="with CUDA graphs, the GEMM of the projections and lm_head: cuBLAS, our skinny GEMM, or per shape whichever "
                        "is faster on this GPU (timed once; default: %(default)s)")


def load_from_arguments(a: argparse.Namespace, tp=None, device=None):
    """engine.load with the options of add_model_arguments (tp/device: from torchrun, if any). The
    commands and the app call it, and each owns its process: the heap is frozen after the load
    (engine/heap.py), so Python's full collections in traced runs no longer walk torch's objects."""
    from . import load
    from .heap import freeze_heap
    from .tp import SINGLE

    heads = False if getattr(a, "no_heads", False) else getattr(a, "heads", None)
    eng = load(a.model, heads=heads, device=device or a.device, dtype=a.dtype, max_seq_len=a.max_seq_len,
               backend=a.backend, tp=tp or SINGLE, cuda_graphs=a.cuda_graphs, gemm=a.gemm)
    freeze_heap()
    return eng


def add_generation_arguments(p: argparse.ArgumentParser, exclude: tuple[str, ...] = (), **defaults) -> None:
    """A flag per GenerationConfig field (`--max-new-tokens`, `--mode`, ...); `defaults` override."""
    types = {"max_new_tokens": positive_int, "top_k": nonneg_int, "seed": nonneg_int, "temperature": float,
             "top_p": float, "tree": str, "mode": str, "accept": str, "trace_file": str}
    for f in dataclasses.fields(GenerationConfig):
        meta = dict(f.metadata)
        if meta.pop("cli", True) is False or f.name in exclude:
            continue
        flag = meta.pop("flag", "--" + f.name.replace("_", "-"))
        kw = {"dest": f.name, "default": defaults.get(f.name, f.default), **meta}
        if "action" not in kw:
            kw["type"] = types[f.name]
        p.add_argument(flag, **kw)


def config_from_arguments(a: argparse.Namespace, **overrides) -> GenerationConfig:
    """The GenerationConfig a parsed command line describes (fields it lacks keep their defaults)."""
    values = {f.name: getattr(a, f.name) for f in dataclasses.fields(GenerationConfig) if hasattr(a, f.name)}
    return GenerationConfig(**{**values, **overrides}).validate()


def add_prompt_set_arguments(p: argparse.ArgumentParser, count: int = 12, offset: int = 0) -> None:
    p.add_argument("--prompts-file", default=None, metavar="FILE",
                   help="prompts: JSONL with 'prompt' or 'turns' per line, or text separated by '---' lines")
    p.add_argument("--prompts", type=nonneg_int, default=None,
                   help=f"how many prompts: the first N of --prompts-file (default: all), or N bundled held-out "
                        f"prompts (default {count})")
    p.set_defaults(default_prompts=count, default_offset=offset)
    p.add_argument("--offset", type=nonneg_int, default=None,
                   help=f"skip this many prompts first (default: none of --prompts-file, {offset} of the bundled ones)")


def output_path(path: str) -> str:
    """A path to write a file to, refused before any work when a directory, FIFO or device is there
    (a FIFO would block the writer; `--out /dev/null` must never replace the device node)."""
    import trees

    trees.check_output_file(path)
    return path
