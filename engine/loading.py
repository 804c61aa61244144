"""Load Llama-family checkpoints and Medusa heads from local files, strictly and offline."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from .config import ModelArgs, ModelLoadError, rope_inv_freq
from .heads import MedusaHeads, heads_from_state_dict
from .model import Transformer
from .tp import SINGLE, TP, check_divisible, is_row_parallel_bias, shard_dim

DEMO_DIR = Path(__file__).resolve().parent.parent / "models" / "demo"
HEAD_FILES = ("medusa_heads.safetensors", "medusa_lm_head.safetensors", "medusa_lm_head.pt")
_IGNORED_KEYS = ("rotary_emb.inv_freq",)


def resolve_model_dir(model: str | os.PathLike) -> Path:
    """`demo`, a local directory, or a hub id already in the local cache (never downloads)."""
    if str(model) == "demo":
        path = Path(os.environ.get("MEDUSA_DEMO_MODEL", DEMO_DIR))
        if not (path / "config.json").exists():
            raise ModelLoadError(f"the demo model is missing at {path} (expected config.json there)")
        return path
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"{path}: expected a model directory (config.json + *.safetensors)")
        if not (path / "config.json").exists():
            raise ModelLoadError(f"{path}: no config.json in this directory")
        return path
    s = str(model)
    if s.count("/") == 1 and not s.startswith((".", "/")):
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(s, local_files_only=True))
        except Exception:
            raise ModelLoadError(
                f"{s!r} is not a local directory and is not in the local Hugging Face cache; "
                "downloads are disabled (offline): pass the path of a downloaded model"
            ) from None
    raise ModelLoadError(f"{path}: no such model directory")


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """One weights file: safetensors, or a `.pt`/`.bin` read with weights_only=True (no pickled code)."""
    try:
        if path.suffix == ".safetensors":
            return load_file(str(path))
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt file, or a pickle that needs code to load
        raise ModelLoadError(f"{path}: cannot read weights ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ModelLoadError(f"{path}: expected a state dict of tensors")
    return obj


def base_weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / s for s in shards]
    if (model_dir / "model.safetensors").exists():
        return [model_dir / "model.safetensors"]
    files = sorted(model_dir.glob("model-*-of-*.safetensors")) or sorted(
        p for p in model_dir.glob("*.safetensors") if p.name not in HEAD_FILES)
    if files:
        return files
    bins = sorted(model_dir.glob("pytorch_model*.bin"))
    if bins:
        return bins
    raise ModelLoadError(f"{model_dir}: no model weights (*.safetensors or pytorch_model*.bin)")


def _strip(key: str) -> str:
    for prefix in ("base_model.model.", "base_model."):
        if key.startswith(prefix):
            key = key[len(prefix) :]
    return key[len("model.") :] if key.startswith("model.") else key


def _tensors(path: Path, tp: TP):
    """(key, tensor) of one weights file. Under tensor parallelism a safetensors file is read by
    slice: split tensors only this rank's share, so no rank reads the whole model."""
    if path.suffix != ".safetensors" or tp.world == 1:
        yield from read_state_dict(path).items()
        return
    try:
        f = safe_open(str(path), framework="pt")
        for key in f.keys():
            dim = shard_dim(_strip(key))
            if dim is None:
                yield key, f.get_tensor(key)
            else:
                sl = f.get_slice(key)
                part = tp.part(sl.get_shape()[dim])
                yield key, sl[part] if dim == 0 else sl[:, part]
    except Exception as e:
        raise ModelLoadError(f"{path}: cannot read weights ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


def load_base(model_dir: Path, device, dtype, tp: TP = SINGLE) -> tuple[Transformer, dict[str, torch.Tensor]]:
    """Build the Transformer (this rank's shard under `tp`) and fill every parameter by name.
    Returns any `medusa_head.*` tensors; `model.weight_bytes_read` says how much was read."""
    cfg_path = model_dir / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{cfg_path}: cannot read config ({e})") from None
    args = ModelArgs.from_hf_config(cfg, where=str(cfg_path))
    check_divisible(args, tp.world, str(cfg_path))
    with torch.device("meta"):
        model = Transformer(args, tp)
    expected = {k: v for k, v in model.state_dict().items()}
    if args.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    loaded: dict[str, torch.Tensor] = {}
    medusa: dict[str, torch.Tensor] = {}
    nbytes = 0
    for f in base_weight_files(model_dir):
        for key, t in _tensors(f, tp):
            nbytes += t.numel() * t.element_size()
            if key.startswith("medusa_head."):
                medusa[key[len("medusa_head.") :]] = t
                continue
            name = _strip(key)
            if name.endswith(_IGNORED_KEYS):
                continue
            if name == "lm_head.weight" and args.tie_word_embeddings:
                continue  # some tied checkpoints store the copy anyway
            if name not in expected:
                raise ModelLoadError(f"{f}: unexpected key {key!r} for a {args.model_type} model")
            if tuple(t.shape) != tuple(expected[name].shape):
                raise ModelLoadError(f"{f}: key {key!r} has shape {tuple(t.shape)}, config implies {tuple(expected[name].shape)}")
            loaded[name] = torch.zeros_like(t) if tp.rank > 0 and is_row_parallel_bias(name) else t
    missing = [k for k in expected if k not in loaded]
    if missing:
        raise ModelLoadError(f"{model_dir}: missing weight key {'model.' + missing[0] if missing[0] != 'lm_head.weight' else missing[0]!r}"
                             + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    model = model.to_empty(device=device).to(dtype)
    with torch.no_grad():
        for name, p in model.state_dict(keep_vars=True).items():
            if name in loaded:
                p.copy_(loaded[name])
    model.inv_freq = rope_inv_freq(args).to(device)  # float32 always: RoPE angles need it
    if args.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.weight_bytes_read = nbytes
    return model.eval(), medusa


def find_heads(model_dir: Path) -> Path | None:
    for name in HEAD_FILES:
        if (model_dir / name).exists():
            return model_dir / name
    return None


def load_heads(source: str | os.PathLike | dict, args: ModelArgs, device, dtype, where: str = "heads",
               tp: TP = SINGLE) -> MedusaHeads:
    """Heads from a file, a directory holding one of HEAD_FILES, or an in-memory state dict."""
    if isinstance(source, dict):
        sd = source
    else:
        path = Path(source)
        if path.is_dir():
            found = find_heads(path)
            if found is None:
                raise ModelLoadError(f"{path}: no heads file ({', '.join(HEAD_FILES)})")
            path = found
        if not path.exists():
            raise ModelLoadError(f"{path}: no such heads file")
        sd = read_state_dict(path)
        where = str(path)
    heads = heads_from_state_dict(sd, args.dim, args.vocab_size, where, tp)
    return heads.to(device=device, dtype=dtype).eval()
