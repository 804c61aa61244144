"""Build and load Llama-family models, Medusa heads and tokenizers, strictly and offline.

`build_model` is the one factory: `load_base` (checkpoints), the benchmarks (random weights at
7B shapes), training and conversion all make their Transformer through it, and every weight goes
in through `fill_model`, which names any missing, unexpected or misshapen key (never strict=False).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

import trees

from .config import ModelArgs, ModelLoadError, rope_inv_freq
from .gemm_choice import GEMMS
from .heads import MedusaHeads, heads_from_state_dict, heads_from_tensors
from .model import Transformer
from .tp import SINGLE, TP, check_divisible, is_row_parallel_bias, shard_dim

REPO_MODELS = Path(__file__).resolve().parent.parent / "models"
DEMO_DIR = REPO_MODELS / "demo"
HEAD_FILES = ("medusa_heads.safetensors", "medusa_lm_head.safetensors", "medusa_lm_head.pt")
TREE_FILE = "medusa_choices.json"  # a tree file beside the heads: the default tree for them
_IGNORED_KEYS = ("rotary_emb.inv_freq",)


def cache_root() -> Path:
    """Where fetched models and data go: $MEDUSA_WORKBENCH_CACHE, else ~/.cache/medusa-workbench."""
    return Path(os.environ.get("MEDUSA_WORKBENCH_CACHE") or Path.home() / ".cache" / "medusa-workbench").expanduser()


def data_dir() -> Path:
    """Where `fetch` puts prompt files (MT-Bench, ShareGPT) for the CLI and the workbench."""
    return cache_root() / "data"


@dataclass(frozen=True)
class NamedModel:
    """A model users name instead of a path: the base model's folder, and the heads (and default
    tree) shipped in this repository for it. `fetched` models are imported by `python -m engine fetch`."""

    name: str
    heads_dir: Path
    fetched: bool

    @property
    def base_dir(self) -> Path:
        if self.name == "demo":
            return Path(os.environ.get("MEDUSA_DEMO_MODEL", DEMO_DIR))
        return cache_root() / "models" / self.name


NAMED_MODELS = {"demo": NamedModel("demo", DEMO_DIR, fetched=False),
                "smollm2": NamedModel("smollm2", REPO_MODELS / "smollm2-medusa", fetched=True)}


def resolve_model_dir(model: str | os.PathLike) -> Path:
    """A named model (`demo`, `smollm2`), a local directory, or a hub id already in the local cache
    (never downloads)."""
    named = NAMED_MODELS.get(str(model))
    if named is not None:
        path = named.base_dir
        if not (path / "config.json").exists():
            if named.fetched:
                raise ModelLoadError(f"the {named.name} model is not here yet ({path}): run `python -m engine fetch "
                                     f"{named.name}` once (it downloads and imports it)")
            raise ModelLoadError(f"the {named.name} model is missing at {path} (expected config.json there)")
        return path
    path = Path(model).expanduser()
    if path.exists():
        if path.is_file() and path.suffix == ".gguf":
            raise ModelLoadError(f"{path}: a GGUF file; import it once with `python -m engine import-gguf {path} "
                                 "--out DIR`, then pass --model DIR")
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


@dataclass(frozen=True)
class HeadsFolder:
    """FasterDecoding's published heads layout (the `medusa-vicuna-7b-v1.3` repos): a `config.json`
    holding only the Medusa fields beside `medusa_lm_head.pt` (or `.safetensors`). It is not a model:
    its config names the base model (`base_model_name_or_path`), which lives elsewhere."""

    path: Path
    heads_file: Path
    num_heads: int | None  # medusa_num_heads, as the config states it
    num_layers: int | None  # medusa_num_layers
    base: str | None  # base_model_name_or_path

    def describe(self) -> str:
        return f"a Medusa heads folder ({self.num_heads} heads, {self.num_layers} ResBlock each) for base model {self.base!r}"

    def base_dir(self) -> Path:
        """The base model it names, if it is here: a named model, a local folder or the local
        Hugging Face cache (never downloads)."""
        if not self.base:
            raise ModelLoadError(f"{self.path}: {self.describe()} names no base model; pass --model BASE_DIR --heads {self.path}")
        try:
            base = resolve_model_dir(self.base)
        except ModelLoadError as e:
            raise ModelLoadError(f"{self.path}: {self.describe()}, which is not here ({e}); "
                                 f"pass --model BASE_DIR --heads {self.path}") from None
        if read_heads_folder(base) is not None:  # itself, or another heads folder: no model to load
            raise ModelLoadError(f"{self.path}: its base_model_name_or_path {self.base!r} is a heads folder, not a model; "
                                 f"pass --model BASE_DIR --heads {self.path}")
        return base

    def disagreements(self, num_heads: int, num_layers: int) -> list[str]:
        """Where the heads file differs from what the config says (the reference builds its heads
        from the config, so a disagreement would load differently there)."""
        return [f"{self.path}: config.json says {key} {stated}, {self.heads_file.name} holds {found}"
                for key, stated, found in (("medusa_num_heads", self.num_heads, num_heads),
                                           ("medusa_num_layers", self.num_layers, num_layers))
                if stated is not None and stated != found]


def read_heads_folder(path: str | os.PathLike) -> HeadsFolder | None:
    """The folder as a HeadsFolder, or None when it is not one (a model folder, a file, a name)."""
    p = Path(path).expanduser()
    if str(path) in NAMED_MODELS or not (p / "config.json").is_file():
        return None
    try:
        cfg = trees.read_json_file(p / "config.json")
    except trees.JsonInputError as e:
        raise ModelLoadError(f"cannot read the model config: {e}") from None
    if not isinstance(cfg, dict) or "medusa_num_heads" not in cfg or cfg.get("model_type"):
        return None  # a model's own config (a Medusa-2 checkpoint keeps the Medusa fields beside model_type)
    heads_file = find_heads(p)
    if heads_file is None:
        raise ModelLoadError(f"{p}: config.json has the Medusa fields of a heads folder, but there is no heads file "
                             f"({', '.join(HEAD_FILES)})")

    def count(key: str) -> int | None:
        v = cfg.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ModelLoadError(f"{p / 'config.json'}: {key} must be a positive integer, got {v!r}")
        return v

    base = cfg.get("base_model_name_or_path")
    if base is not None and not isinstance(base, str):
        raise ModelLoadError(f"{p / 'config.json'}: base_model_name_or_path must be a string, got {base!r}")
    return HeadsFolder(p, heads_file, count("medusa_num_heads"), count("medusa_num_layers"), base)


def check_heads_folder(folder: HeadsFolder, num_heads: int, num_layers: int) -> None:
    """Refuse a heads file that differs from its folder's config (HeadsFolder.disagreements)."""
    problems = folder.disagreements(num_heads, num_layers)
    if problems:
        raise ModelLoadError(problems[0])


def read_config(model_dir: Path) -> ModelArgs:
    path = model_dir / "config.json"
    try:
        cfg = trees.read_json_file(path)
    except trees.JsonInputError as e:
        raise ModelLoadError(f"cannot read the model config: {e}") from None
    return ModelArgs.from_hf_config(cfg, where=str(path))


def default_backend(device: torch.device) -> str:
    """Our Triton kernel on CUDA (SDPA inside a CUDA graph would attend over the whole cache), SDPA
    elsewhere and where Triton is missing."""
    from .kernels import tree_attention

    return "triton" if device.type == "cuda" and tree_attention.triton is not None else "sdpa"


def check_backend(backend: str, device: torch.device, dtype: torch.dtype | None = None) -> None:
    """A backend that cannot run here is refused at load, in one line, not at the first step."""
    from .attention import BACKENDS
    from .kernels import flash4, tree_attention

    if backend not in BACKENDS:
        raise ModelLoadError(f"unknown attention backend {backend!r}; choose from {', '.join(BACKENDS)}")
    if backend == "triton" and (device.type != "cuda" or tree_attention.triton is None):
        raise ModelLoadError("the triton backend needs a CUDA device and Triton installed; use --backend sdpa")
    if backend == "flash_attn":
        if (why := flash4.unavailable_reason(device)) is not None:
            raise ModelLoadError(f"{why}; use --backend triton or sdpa")
        if dtype is not None and dtype not in flash4.DTYPES:
            raise ModelLoadError(f"the flash_attn backend runs bfloat16/float16, not {str(dtype).removeprefix('torch.')}; "
                                 "pass --dtype bfloat16 or use --backend triton")


def build_model(args: ModelArgs, tp: TP = SINGLE, device: str | torch.device = "meta", backend: str = "sdpa",
                fused: bool = False, gemm: str = "cublas") -> Transformer:
    """An unfilled Transformer (on the meta device by default: no memory until `fill_model`).
    fused=True (CUDA graphs) stacks q/k/v and gate/up once filled and runs the Triton pointwise
    kernels; it needs a head dim whose half is a power of two (64, 128), else the references run.
    gemm (with fused): which GEMM runs the projections and the lm_head, one of gemm_choice.GEMMS ("cublas", "skinny":
    engine/kernels/gemv.py, "auto": per shape whichever is faster here)."""
    if gemm not in GEMMS:
        raise ModelLoadError(f"gemm must be one of {', '.join(GEMMS)}, not {gemm!r}")
    half = args.head_dim // 2
    fused = fused and half & (half - 1) == 0
    with torch.device(device):
        model = Transformer(args, tp, backend=backend, fused=fused, gemm=gemm if fused else "cublas")
    return model


def fill_model(model: Transformer, tensors: Iterable[tuple[str, torch.Tensor]], device, dtype, where: str,
               share: bool = False) -> tuple[Transformer, dict[str, torch.Tensor], int]:
    """Put named HF-layout tensors into a model from `build_model`: every expected key exactly once,
    with its shape; `medusa_head.*` keys are returned apart. share=True uses the tensors themselves
    (same device and dtype: the benchmarks' random weights, no second copy).
    -> (model, medusa head tensors, bytes read)."""
    args, tp = model.args, model.tp
    expected = dict(model.state_dict())
    loaded: dict[str, torch.Tensor] = {}
    medusa: dict[str, torch.Tensor] = {}
    seen: dict[str, str] = {}  # our name -> the checkpoint key it came from
    nbytes = 0
    for key, t in tensors:
        nbytes += t.numel() * t.element_size()
        check_float(key, t.dtype, where)
        name = key if key.startswith("medusa_head.") else strip_prefix(key)
        if name in seen:  # the same weight twice (two shards, or `model.x` beside `x`): which one wins is a guess
            raise ModelLoadError(f"{where}: key {key!r} duplicates {seen[name]!r}")
        seen[name] = key
        if key.startswith("medusa_head."):
            medusa[key[len("medusa_head."):]] = t
            continue
        if name.endswith(_IGNORED_KEYS):
            continue
        if name not in expected:
            raise ModelLoadError(f"{where}: unexpected key {key!r} for a {args.model_type} model")
        if tuple(t.shape) != tuple(expected[name].shape):
            raise ModelLoadError(f"{where}: key {key!r} has shape {tuple(t.shape)}, config implies {tuple(expected[name].shape)}")
        loaded[name] = torch.zeros_like(t) if tp.rank > 0 and is_row_parallel_bias(name) else t
    # Tied embeddings as transformers (5.x) loads them: lm_head is the embedding matrix unless the
    # checkpoint stores an lm_head.weight of its own that differs from it; then the stored one is used.
    tied = args.tie_word_embeddings and ("lm_head.weight" not in loaded or torch.equal(
        loaded["lm_head.weight"], loaded.get("embed_tokens.weight", loaded["lm_head.weight"])))
    if tied:
        expected.pop("lm_head.weight", None)
        loaded.pop("lm_head.weight", None)
    elif args.tie_word_embeddings:  # the model was built tied: give lm_head its own (still unallocated) matrix
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    missing = [k for k in expected if k not in loaded]
    if missing:
        first = missing[0] if missing[0] == "lm_head.weight" else "model." + missing[0]
        raise ModelLoadError(f"{where}: missing weight key {first!r}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    if share:
        if tied:
            loaded["lm_head.weight"] = loaded["embed_tokens.weight"]
        model.load_state_dict(loaded, strict=True, assign=True)
    else:
        model = model.to_empty(device=device).to(dtype)
        with torch.no_grad():
            for name, p in model.state_dict(keep_vars=True).items():
                if name in loaded:
                    p.copy_(loaded[name])
    model.inv_freq = rope_inv_freq(args).to(device)  # float32 always: RoPE angles need it
    if tied:
        model.lm_head.weight = model.embed_tokens.weight
    if model.fused:
        model.stack_projections()
    return model.eval().requires_grad_(False), medusa, nbytes


FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                       "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def check_float(key: str, dtype: torch.dtype | str, where: str) -> None:
    """Weights are floats: an int8 or bool tensor would be cast to floats and decode as nonsense
    (quantised checkpoints need their scales, which we do not read). `dtype`: a torch dtype, or the
    name a safetensors header gives ("I8")."""
    name = _SAFETENSORS_DTYPES.get(dtype, dtype) if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    if name not in FLOAT_DTYPES:
        raise ModelLoadError(f"{where}: key {key!r} is {name}; weights must be {', '.join(FLOAT_DTYPES)}")


def check_weights_file(path: Path) -> None:
    """A weights path must be a regular file before anything opens it (a FIFO would block the read)."""
    try:
        trees.open_for_reading(path, binary=True).close()
    except trees.JsonInputError as e:
        raise ModelLoadError(str(e)) from None


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """One weights file: safetensors, or a `.pt`/`.bin` read with weights_only=True (no pickled code)
    and memory-mapped (nothing is read until a tensor is used)."""
    check_weights_file(path)
    try:
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as f:
                obj = {k: f.get_tensor(k) for k in f.keys()}
        else:
            obj = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # corrupt file, or a pickle that needs code to load
        raise ModelLoadError(f"{path}: cannot read weights ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        raise ModelLoadError(f"{path}: expected a state dict of tensors")
    for k, v in obj.items():
        check_float(k, v.dtype, str(path))
    return obj


def base_weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = trees.read_json_file(index).get("weight_map")
        except (trees.JsonInputError, AttributeError) as e:
            raise ModelLoadError(f"{index}: not a safetensors index ({e})") from None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError(f"{index}: 'weight_map' must be an object of weight names to shard files")
        for key, shard in weight_map.items():
            if not (isinstance(shard, str) and shard.endswith(".safetensors") and shard == Path(shard).name
                    and not shard.startswith(".")):
                raise ModelLoadError(f"{index}: weight_map[{key!r}] is {shard!r}; expected a .safetensors file name "
                                     "in the model directory")
        return [model_dir / s for s in sorted(set(weight_map.values()))]
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


def strip_prefix(key: str) -> str:
    """HF checkpoint key -> our parameter name (`model.` and PEFT prefixes dropped)."""
    for prefix in ("base_model.model.", "base_model."):
        if key.startswith(prefix):
            key = key[len(prefix):]
    return key[len("model."):] if key.startswith("model.") else key


def _tensors(path: Path, tp: TP):
    """(key, tensor) of one weights file. Under tensor parallelism a safetensors file is read by
    slice: split tensors only this rank's share, so no rank reads the whole model."""
    if path.suffix != ".safetensors" or tp.world == 1:
        yield from read_state_dict(path).items()
        return
    check_weights_file(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                dim = shard_dim(strip_prefix(key))
                if dim is None:
                    yield key, f.get_tensor(key)
                else:
                    sl = f.get_slice(key)
                    part = tp.part(sl.get_shape()[dim])
                    yield key, sl[part] if dim == 0 else sl[:, part]
    except ModelLoadError:
        raise
    except Exception as e:
        raise ModelLoadError(f"{path}: cannot read weights ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


def load_base(model_dir: Path, device, dtype, tp: TP = SINGLE, backend: str = "sdpa", fused: bool = False,
              gemm: str = "cublas") -> tuple[Transformer, dict[str, torch.Tensor], int]:
    """The Transformer of a model directory (this rank's shard under `tp`), every parameter filled
    by name. -> (model, any `medusa_head.*` tensors, bytes read)."""
    args = read_config(model_dir)
    check_divisible(args, tp.world, str(model_dir / "config.json"))
    model = build_model(args, tp, backend=backend, fused=fused, gemm=gemm)
    tensors = (kv for f in base_weight_files(model_dir) for kv in _tensors(f, tp))
    return fill_model(model, tensors, device, dtype, str(model_dir))


def heads_dir(model: str | os.PathLike, model_dir: Path) -> Path:
    """Where a model's heads are looked for: the repo's folder for a named model, else the model's own."""
    named = NAMED_MODELS.get(str(model))
    return named.heads_dir if named is not None else model_dir


def generation_eos(model_dir: Path) -> tuple[int, ...]:
    """End-of-sequence ids from `generation_config.json` (instruct models list their end-of-turn token
    there, e.g. Llama-3's <|eot_id|>, beside the base EOS)."""
    path = model_dir / "generation_config.json"
    if not path.exists():
        return ()
    try:
        eos = trees.read_json_file(path).get("eos_token_id")
    except (trees.JsonInputError, AttributeError):
        raise ModelLoadError(f"{path}: not a JSON object") from None
    ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
    if not all(isinstance(e, int) and not isinstance(e, bool) and e >= 0 for e in ids):
        raise ModelLoadError(f"{path}: eos_token_id must be an integer or a list of integers")
    return tuple(ids)


def find_heads(model_dir: Path) -> Path | None:
    for name in HEAD_FILES:
        if (model_dir / name).exists():
            return model_dir / name
    return None


def load_heads(source: str | os.PathLike | dict, args: ModelArgs, device, dtype, where: str = "heads",
               tp: TP = SINGLE) -> MedusaHeads:
    """Heads from a file, a directory holding one of HEAD_FILES, or an in-memory state dict. A
    safetensors file is checked from its header (key names and shapes) before any tensor is read."""
    if isinstance(source, dict):
        for k, t in source.items():
            check_float(k, t.dtype, where)
        heads = heads_from_state_dict(source, args.dim, args.vocab_size, where, tp)
        return heads.to(device=device, dtype=dtype).eval()
    path = Path(source)
    if path.is_dir():
        found = find_heads(path)
        if found is None:
            raise ModelLoadError(f"{path}: no heads file ({', '.join(HEAD_FILES)})")
        path = found
    if not path.exists():
        raise ModelLoadError(f"{path}: no such heads file")
    check_weights_file(path)
    if path.suffix == ".safetensors":
        try:
            f = safe_open(str(path), framework="pt")
            slices = {k: f.get_slice(k) for k in f.keys()}
            shapes = {k: tuple(sl.get_shape()) for k, sl in slices.items()}
            dtypes = {k: sl.get_dtype() for k, sl in slices.items()}
        except Exception as e:
            raise ModelLoadError(f"{path}: cannot read weights ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
        for k, dt in dtypes.items():
            check_float(k, dt, str(path))
        heads = heads_from_tensors(shapes, f.get_tensor, args.dim, args.vocab_size, str(path), tp)
    else:
        heads = heads_from_state_dict(read_state_dict(path), args.dim, args.vocab_size, str(path), tp)
    return heads.to(device=device, dtype=dtype).eval()


def load_tokenizer(model_dir: Path):
    files = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
    if not any((model_dir / f).exists() for f in files):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as e:
        raise ModelLoadError(f"{model_dir}: cannot load the tokenizer ({type(e).__name__}: {e})") from None
