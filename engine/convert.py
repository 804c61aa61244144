"""Inspect head checkpoints and convert them between formats (never writing pickles).

Formats: `faster-decoding` (FasterDecoding Medusa-1 keys with each head's own projection, as
`.safetensors`), `safetensors` (the source's own layout, re-saved as safetensors), `shared-lm-head`
(ResBlocks only: our `medusa_heads.safetensors`), `medusa2` (a model directory whose state dict holds
the base weights and `medusa_head.*`), `vllm` (a draft-model folder for vLLM's Medusa proposer:
its module names and config, vllm/model_executor/models/medusa.py). Dropping private projections is
lossy and refused unless allowed; adding them (copies of the base lm_head) is exact.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from .config import ModelArgs, ModelLoadError
from .heads import MedusaHeads, detect_layout, validate_heads
from .loading import (
    HEAD_FILES,
    base_weight_files,
    check_heads_folder,
    find_heads,
    read_config,
    read_heads_folder,
    read_state_dict,
    resolve_model_dir,
    strip_prefix,
)

TARGETS = ("faster-decoding", "safetensors", "shared-lm-head", "medusa2", "vllm")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def read_heads_source(path: str | Path) -> tuple[dict[str, torch.Tensor], str, Path | None]:
    """-> (heads-only state dict, where, model dir if the heads live inside a Medusa-2 checkpoint)."""
    p = Path(path)
    if p.is_dir():
        found = find_heads(p)
        if found is not None:
            return read_state_dict(found), str(found), None
        if (p / "config.json").exists():
            sd = {}
            for f in base_weight_files(p):
                sd.update({k[len("medusa_head."):]: v for k, v in read_state_dict(f).items() if k.startswith("medusa_head.")})
            if sd:
                return sd, f"{p} (medusa_head.*)", p
        raise ModelLoadError(f"{p}: no Medusa heads here ({', '.join(HEAD_FILES)} or medusa_head.* keys)")
    if not p.exists():
        raise ModelLoadError(f"{p}: no such file")
    return read_state_dict(p), str(p), None


def _model_args(model_dir: Path) -> ModelArgs:
    return read_config(model_dir)


def inspect(path: str | Path, model: str | Path | None = None) -> dict:
    """What a model directory, heads file or Medusa-2 checkpoint holds, and any mismatch with `model`."""
    p = Path(path)
    info: dict = {"path": str(p)}
    base_dir = None
    folder = read_heads_folder(p)
    if folder is not None:  # official heads: say what they are, and look for the base they name
        info["heads_folder"] = {"what": folder.describe(), "medusa_num_heads": folder.num_heads,
                                "medusa_num_layers": folder.num_layers, "base_model_name_or_path": folder.base,
                                "base_here": None}
        try:
            base_dir = folder.base_dir()
            info["heads_folder"]["base_here"] = str(base_dir)
        except ModelLoadError as e:
            info["note"] = str(e)
    elif p.is_dir() and (p / "config.json").exists():
        base_dir = p
    if model is not None:
        base_dir = resolve_model_dir(model)
    if base_dir is not None:
        a = _model_args(base_dir)
        info["base"] = {"dir": str(base_dir), "model_type": a.model_type, "vocab_size": a.vocab_size, "hidden_size": a.dim,
                        "layers": a.n_layers, "heads": a.n_heads, "kv_heads": a.n_kv_heads, "head_dim": a.head_dim,
                        "intermediate_size": a.intermediate_size, "context": a.max_position_embeddings,
                        "tied_embeddings": a.tie_word_embeddings}
    try:
        sd, where, inside = read_heads_source(p)
    except ModelLoadError as e:
        if base_dir is None:
            raise
        info["heads"] = None
        info["note"] = str(e)
        return info
    layout = detect_layout(list(sd), where)
    dims = {tuple(v.shape) for k, v in sd.items() if k.endswith("linear.weight")}
    dim = next(iter(dims))[0] if dims else None
    params = sum(v.numel() for v in sd.values())
    dtype = sorted({str(v.dtype).replace("torch.", "") for v in sd.values()})
    elt = next(iter(sd.values())).element_size()
    shared_read = 0
    if layout.shared_lm_head and base_dir is not None:
        shared_read = info["base"]["vocab_size"] * info["base"]["hidden_size"] * elt  # one batched GEMM reads lm_head once
    if folder is not None:
        info["heads_folder"]["disagrees"] = folder.disagreements(layout.num_heads, layout.num_layers)
    info["heads"] = {"source": where, "format": "medusa2" if inside is not None else layout.format,
                     "num_heads": layout.num_heads, "resblocks_per_head": layout.num_layers,
                     "shares_base_lm_head": layout.shared_lm_head, "hidden_size": dim,
                     "vocab_size": None if layout.shared_lm_head else sd[f"0.{layout.num_layers}.weight"].shape[0],
                     "dtype": dtype, "parameters": params, "bytes": params * elt,
                     "bytes_per_step_added": params * elt + shared_read}
    if base_dir is not None:
        problems = []
        try:  # the check `load` makes, so inspect and generate never disagree
            validate_heads({k: tuple(t.shape) for k, t in sd.items()}, info["base"]["hidden_size"],
                           info["base"]["vocab_size"], where)
        except ModelLoadError as e:
            problems.append(str(e))
        info["mismatch"] = problems
        base_bytes = sum(f.stat().st_size for f in base_weight_files(base_dir))
        info["heads"]["share_of_step_bytes"] = round(info["heads"]["bytes_per_step_added"] / max(base_bytes, 1), 4)
    return info


def _lm_head(model_dir: Path) -> torch.Tensor:
    """The base model's output matrix as `load` uses it: a stored lm_head.weight, else (tied
    embeddings) the embedding matrix."""
    a = _model_args(model_dir)
    found = {}
    for f in base_weight_files(model_dir):
        found.update({strip_prefix(k): v for k, v in read_state_dict(f).items()
                      if strip_prefix(k) in ("lm_head.weight", "embed_tokens.weight")})
    if "lm_head.weight" in found:
        return found["lm_head.weight"]
    if a.tie_word_embeddings and "embed_tokens.weight" in found:
        return found["embed_tokens.weight"]
    raise ModelLoadError(f"{model_dir}: no lm_head weight found")


def tp_shards(sd: dict[str, torch.Tensor], num_layers: int, n: int) -> list[dict[str, torch.Tensor]]:
    """Split as the tensor-parallel heads run: each ResBlock's W and b column-parallel along the
    output dimension (rows of W), each head's vocabulary projection row-parallel along hidden size."""
    out: list[dict[str, torch.Tensor]] = [{} for _ in range(n)]
    for k, v in sd.items():
        layer = int(k.split(".")[1])
        if k.endswith("linear.weight") or k.endswith("linear.bias"):
            if v.shape[0] % n:
                raise ModelLoadError(f"--tp {n} does not divide hidden size {v.shape[0]} (key {k!r})")
            parts = v.chunk(n, dim=0)
        elif layer == num_layers:
            if v.shape[1] % n:
                raise ModelLoadError(f"--tp {n} does not divide hidden size {v.shape[1]} (key {k!r})")
            parts = v.chunk(n, dim=1)
        else:
            raise ModelLoadError(f"key {k!r} has no tensor-parallel rule")
        for r in range(n):
            out[r][k] = parts[r].contiguous()
    return out


def convert(src: str | Path, to: str, out: str | Path, model: str | Path | None = None, dtype: str | None = None,
            allow_lossy: bool = False, tp: int = 1, data: str | None = None) -> dict:
    if to not in TARGETS:
        raise ValueError(f"unknown target {to!r}; choose from {', '.join(TARGETS)}")
    if to in ("medusa2", "vllm"):
        new_folder(out)
    sd, where, ckpt_dir = read_heads_source(src)
    layout = detect_layout(list(sd), where)
    folder = read_heads_folder(src)
    if folder is not None:  # an official heads folder: its config must agree, and it names the base
        check_heads_folder(folder, layout.num_heads, layout.num_layers)
        if model is None and folder.base:
            try:
                ckpt_dir = folder.base_dir()
            except ModelLoadError:
                pass  # only needed by some targets, which then ask for --model
    model_dir = resolve_model_dir(model) if model is not None else ckpt_dir
    if dtype is not None:
        if dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(_DTYPES)}")
        sd = {k: v.to(_DTYPES[dtype]) for k, v in sd.items()}
    report: dict = {"source": where, "from": layout.format, "to": to, "num_heads": layout.num_heads}
    L = layout.num_layers
    if to == "faster-decoding" and layout.shared_lm_head:
        if model_dir is None:
            raise ValueError("shared-lm-head -> faster-decoding copies the base lm_head into each head: pass --model DIR")
        w = _lm_head(model_dir)
        sd.update({f"{h}.{L}.weight": w.to(next(iter(sd.values())).dtype).clone() for h in range(layout.num_heads)})
    if to == "shared-lm-head" and not layout.shared_lm_head:
        proj = {k: v for k, v in sd.items() if k.endswith(f".{L}.weight")}
        lossless = False
        if model_dir is not None:
            w = _lm_head(model_dir)
            lossless = all(torch.equal(v.to(w.dtype), w) for v in proj.values())
        if not lossless and not allow_lossy:
            raise ValueError("refusing a lossy conversion: these heads have their own vocabulary projections, "
                             "which shared-lm-head would replace by the base lm_head (pass --allow-lossy)")
        if data is not None and model_dir is not None:
            report["heldout_top1_before"] = _top1(sd, model_dir, data)
        sd = {k: v for k, v in sd.items() if k not in proj}
        if data is not None and model_dir is not None:
            report["heldout_top1_after"] = _top1(sd, model_dir, data)
        report["lossy"] = not lossless
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"format": "shared-lm-head" if to == "shared-lm-head" else detect_layout(list(sd), where).format,
            "num_heads": str(layout.num_heads), "num_layers": str(L)}
    if to == "medusa2":
        if model_dir is None:
            raise ValueError("medusa2 writes the base weights too: pass --model DIR")
        out.mkdir(parents=True, exist_ok=True)
        full: dict[str, torch.Tensor] = {}
        for f in base_weight_files(model_dir):
            full.update({k: v for k, v in read_state_dict(f).items() if not k.startswith("medusa_head.")})
        full.update({f"medusa_head.{k}": v for k, v in sd.items()})
        save_file(full, str(out / "model.safetensors"), metadata={"format": "pt"})
        for f in model_dir.iterdir():
            if f.name == "config.json" or f.name.startswith(("tokenizer", "special_tokens", "generation_config")):
                shutil.copy(f, out / f.name)
        report["out"] = [str(out)]
        return report
    if to == "vllm":
        if tp > 1:
            raise ValueError("vllm: write one folder (--tp 1); vLLM shards the heads itself when it loads them")
        lm_head = _lm_head(model_dir) if layout.shared_lm_head and model_dir is not None else None
        if layout.shared_lm_head and lm_head is None:
            raise ValueError("these heads share the base lm_head, which a vLLM draft folder must hold: pass --model DIR")
        report["out"] = [str(write_vllm(sd, L, layout.num_heads, out, lm_head))]
        return report
    if tp > 1:
        paths = []
        for r, shard in enumerate(tp_shards(sd, L, tp)):
            p = out.with_name(f"{out.stem}.rank{r}-of-{tp}{out.suffix or '.safetensors'}")
            save_file(shard, str(p), metadata={**meta, "tp_rank": str(r), "tp_size": str(tp)})
            paths.append(str(p))
        report["out"] = paths
        return report
    save_file({k: v.contiguous() for k, v in sd.items()}, str(out), metadata=meta)
    report["out"] = [str(out)]
    return report


def new_folder(out: str | Path) -> None:
    """medusa2 and vllm write a folder of their own: never into an existing one (a model's folder, or
    the source's, would be overwritten file by file)."""
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{p}: a file; these targets write a new folder, give a folder path that does not exist")
    if p.is_dir() and any(p.iterdir()):
        raise ValueError(f"{p}: already exists and is not empty; give a new folder")


def vllm_names(sd: dict[str, torch.Tensor], num_layers: int, num_heads: int,
               lm_head: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Our heads under vLLM's Medusa module names: head h's ResBlock l is `blocks.{h}.layers.{l}`
    (nn.Linear, bias present when the config sets medusa_fc_bias), its projection `lm_heads.{h}`; heads
    that share the base lm_head become one `lm_head` (config original_lm_head). vLLM's loader skips
    names it does not know without a word, so these must match its module exactly."""
    out: dict[str, torch.Tensor] = {}
    for h in range(num_heads):
        for layer in range(num_layers):
            out[f"blocks.{h}.layers.{layer}.weight"] = sd[f"{h}.{layer}.linear.weight"]
            out[f"blocks.{h}.layers.{layer}.bias"] = sd[f"{h}.{layer}.linear.bias"]
        if lm_head is None:
            out[f"lm_heads.{h}.weight"] = sd[f"{h}.{num_layers}.weight"]
    if lm_head is not None:
        out["lm_head.weight"] = lm_head.to(next(iter(sd.values())).dtype)
    return {k: v.contiguous() for k, v in out.items()}


def write_vllm(sd: dict[str, torch.Tensor], num_layers: int, num_heads: int, out: Path,
               lm_head: torch.Tensor | None) -> Path:
    """A folder vLLM loads as a Medusa draft model (`speculative_config={"model": out, "method": "medusa"}`):
    model.safetensors under vllm_names, and config.json with the fields of vLLM's MedusaConfig
    (vllm/transformers_utils/configs/medusa.py)."""
    tensors = vllm_names(sd, num_layers, num_heads, lm_head)
    dim = tensors["blocks.0.layers.0.weight"].shape[1]
    vocab = (lm_head if lm_head is not None else tensors["lm_heads.0.weight"]).shape[0]
    config = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": dim, "vocab_size": vocab,
              "num_heads": num_heads, "num_hidden_layers": num_layers, "medusa_fc_bias": True,
              "original_lm_head": lm_head is not None, "truncated_vocab_size": vocab, "max_paths": 64, "topk": 10,
              "torch_dtype": str(tensors["blocks.0.layers.0.weight"].dtype).removeprefix("torch.")}
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def _top1(sd: dict[str, torch.Tensor], model_dir: Path, data: str) -> list[float]:
    """Held-out top-1 accuracy per head of these heads on `data` (a token or text file)."""
    from .heads import heads_from_state_dict
    from .loading import load_base
    from .train.data import read_sequences
    from .train.heads import evaluate_heads

    base, _, _ = load_base(model_dir, torch.device("cpu"), torch.float32)
    heads: MedusaHeads = heads_from_state_dict({k: v.float() for k, v in sd.items()}, base.args.dim, base.args.vocab_size, "heads")
    seqs = read_sequences(data, model_dir, 257, base.args.vocab_size)
    acc = evaluate_heads(heads, base, seqs, 4 * 257, 257, torch.device("cpu"), max_positions=2000)
    return [round(a["top1"], 4) for a in acc]
