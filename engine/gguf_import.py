"""`python -m engine import-gguf FILE --out DIR`: a Llama-family GGUF file as our model folder.

What llama.cpp users have is a GGUF file; what the engine (and transformers) open is a folder of
`config.json`, `model.safetensors` and tokenizer files. The import runs once:
  - metadata -> `config.json` (llama, mistral and qwen2 models) and `generation_config.json`;
    every size is checked by `ModelArgs.from_hf_config`, and every tensor's name and shape against
    what that config implies, before any tensor is dequantised;
  - tensors -> `model.safetensors`, dequantised by the `gguf` package (never by hand here) and
    renamed to the HF layout. llama.cpp's converter reorders the rows of q and k for the llama
    architecture (it rotates interleaved pairs where HF rotates halves); `unpermute_rows` undoes it;
  - tokenizer and chat template -> transformers' GGUF tokenizer conversion, saved beside them.
Weights are written in float32 by default: a dequantised Q4_1 or Q8_0 value is d * q + m with d and
m float16, which float32 holds exactly (bfloat16 would round it again).

Needs the optional `gguf` package (`pip install 'medusa-workbench[gguf]'`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from .config import ModelArgs, ModelLoadError

# GGUF architecture -> (HF model_type, whether llama.cpp permuted the q/k rows). llama.cpp writes
# Mistral models as "llama"; like transformers, we tell them apart by "mistral" in general.name.
ARCHITECTURES = {"llama": ("llama", True), "qwen2": ("qwen2", False)}

# per-layer GGUF tensor name -> HF name (`{i}` is the layer)
_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                   "output.weight": "lm_head.weight"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _gguf():
    try:
        import gguf
    except ImportError:
        raise ModelLoadError("reading GGUF files needs the gguf package: pip install 'medusa-workbench[gguf]'") from None
    return gguf


def open_gguf(path: str | os.PathLike):
    """A GGUFReader over a regular file; a missing, truncated or corrupt file is one ModelLoadError."""
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"{p}: no such GGUF file")
    if not p.is_file():
        raise ModelLoadError(f"{p}: not a regular file")
    gguf = _gguf()
    try:
        return gguf.GGUFReader(str(p))
    except Exception as e:  # the reader raises ValueError, IndexError, struct errors... on a damaged file
        detail = " ".join(str(e).split())[:160] or type(e).__name__
        raise ModelLoadError(f"{p}: not a readable GGUF file (truncated or corrupt?): {detail}") from None


def metadata(reader) -> dict:
    """Every scalar, string and short-array field (token lists and merges are left out)."""
    out = {}
    for name, f in reader.fields.items():
        if name in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            continue
        try:
            out[name] = f.contents()
        except Exception:  # a field the reader cannot decode is not one we use
            continue
    return out


def hf_config(meta: dict, tensor_names: set[str], n_tokens: int | None, where: str) -> dict:
    """The transformers `config.json` that a GGUF file's metadata describes (n_tokens: the length of
    its token list, the vocabulary size when the metadata does not state one)."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelLoadError(f"{where}: GGUF architecture {arch!r} is not supported; supported: {', '.join(ARCHITECTURES)}")
    model_type, _ = ARCHITECTURES[arch]
    if arch == "llama" and "mistral" in str(meta.get("general.name", "")).lower():
        model_type = "mistral"

    def key(name: str, default=None, required: bool = False):
        v = meta.get(f"{arch}.{name}", default)
        if required and v is None:
            raise ModelLoadError(f"{where}: GGUF metadata lacks {arch}.{name}")
        return v

    vocab = key("vocab_size", n_tokens)
    if vocab is None:
        raise ModelLoadError(f"{where}: GGUF metadata gives no vocabulary size and holds no token list")
    dim = key("embedding_length", required=True)
    heads = key("attention.head_count", required=True)
    if isinstance(heads, list) or isinstance(key("attention.head_count_kv"), list):
        raise ModelLoadError(f"{where}: per-layer head counts are not supported")
    scaling_type = key("rope.scaling.type")
    if "rope_freqs.weight" in tensor_names:
        raise ModelLoadError(f"{where}: Llama-3 RoPE scaling (rope_freqs) cannot be read back from a GGUF file; "
                             "import the original Hugging Face model instead")
    cfg = {
        "architectures": [{"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                           "qwen2": "Qwen2ForCausalLM"}[model_type]],
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": dim,
        "num_hidden_layers": key("block_count", required=True),
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads),
        "intermediate_size": key("feed_forward_length", required=True),
        "max_position_embeddings": key("context_length", 2048),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": key("rope.freq_base", 10000.0),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    head_dim = key("attention.key_length") or key("rope.dimension_count")
    if head_dim and isinstance(dim, int) and isinstance(heads, int) and head_dim != dim // heads:
        cfg["head_dim"] = head_dim
    if scaling_type == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": key("rope.scaling.factor", required=True)}
    elif scaling_type not in (None, "none"):
        raise ModelLoadError(f"{where}: RoPE scaling {scaling_type!r} is not supported (none, linear)")
    if model_type == "mistral":  # Mistral v0.1 used a 4096-token window; GGUF files do not record one
        cfg["sliding_window"] = key("attention.sliding_window")
    for field, name in (("bos_token_id", "tokenizer.ggml.bos_token_id"), ("eos_token_id", "tokenizer.ggml.eos_token_id"),
                        ("pad_token_id", "tokenizer.ggml.padding_token_id")):
        if isinstance(meta.get(name), int):
            cfg[field] = meta[name]
    if any(n.endswith("attn_output.bias") for n in tensor_names):
        raise ModelLoadError(f"{where}: an attention output bias is not part of the {model_type} layout")
    return cfg


def expected_tensors(args: ModelArgs, qkv_bias: bool) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> numpy shape (rows, cols) that the config implies."""
    d, hd = args.dim, args.head_dim
    q, kv = args.n_heads * hd, args.n_kv_heads * hd
    out = {"token_embd.weight": (args.vocab_size, d), "output_norm.weight": (d,)}
    if not args.tie_word_embeddings:
        out["output.weight"] = (args.vocab_size, d)
    layer = {"attn_norm.weight": (d,), "attn_q.weight": (q, d), "attn_k.weight": (kv, d), "attn_v.weight": (kv, d),
             "attn_output.weight": (d, q), "ffn_norm.weight": (d,), "ffn_gate.weight": (args.intermediate_size, d),
             "ffn_up.weight": (args.intermediate_size, d), "ffn_down.weight": (d, args.intermediate_size)}
    if qkv_bias:
        layer |= {"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)}
    for i in range(args.n_layers):
        out |= {f"blk.{i}.{name}": shape for name, shape in layer.items()}
    return out


def hf_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    _, layer, rest = gguf_name.split(".", 2)
    return f"model.layers.{layer}.{_LAYER_TENSORS[rest]}"


def unpermute_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row order. HF's RoPE rotates the pair of rows (j, j + hd/2) of each head,
    llama.cpp's the adjacent rows (2j, 2j + 1), so its converter moves HF row s * hd/2 + j to row
    2j + s (s = 0, 1). Reading a head's GGUF rows as [hd/2, 2] and transposing to [2, hd/2] puts
    every row back where HF had it."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def convert_tensors(reader, args: ModelArgs, permuted: bool, dtype: torch.dtype, where: str) -> dict[str, torch.Tensor]:
    """Check every tensor's name and shape against the config, then dequantise and rename them."""
    gguf = _gguf()
    expected = expected_tensors(args, args.qkv_bias)
    found = {t.name: t for t in reader.tensors}
    unknown = sorted(set(found) - set(expected))
    if unknown:
        raise ModelLoadError(f"{where}: unexpected tensor {unknown[0]!r} for this {args.model_type} config"
                             + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""))
    missing = [n for n in expected if n not in found]
    if missing:
        raise ModelLoadError(f"{where}: the metadata implies tensor {missing[0]!r}, which the file does not hold"
                             + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    for name, shape in expected.items():
        got = tuple(int(n) for n in reversed(found[name].shape.tolist()))  # GGUF lists the fastest dimension first
        if got != shape:
            raise ModelLoadError(f"{where}: tensor {name!r} has shape {got}, the metadata implies {shape}")
    out = {}
    for name in expected:
        t = found[name]
        try:
            data = gguf.quants.dequantize(t.data, t.tensor_type)
        except (NotImplementedError, ValueError) as e:
            raise ModelLoadError(f"{where}: cannot dequantise {name!r} ({t.tensor_type.name}): {e}") from None
        w = torch.from_numpy(data.reshape(expected[name]).copy())
        if permuted and name.endswith(("attn_q.weight", "attn_q.bias")):
            w = unpermute_rows(w, args.n_heads)
        elif permuted and name.endswith(("attn_k.weight", "attn_k.bias")):
            w = unpermute_rows(w, args.n_kv_heads)
        out[hf_name(name)] = w.to(dtype).contiguous()
    return out


def save_tokenizer(path: Path, out: Path) -> list[str]:
    """transformers' GGUF tokenizer conversion (vocabulary, merges, special tokens, chat template),
    saved in the HF layout. -> the files written."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    except Exception as e:
        raise ModelLoadError(f"{path}: transformers cannot build a tokenizer from this GGUF file "
                             f"({type(e).__name__}: {' '.join(str(e).split())[:160]})") from None
    return [Path(f).name for f in tok.save_pretrained(str(out))]


def import_gguf(path: str | os.PathLike, out: str | os.PathLike, dtype: str = "float32", overwrite: bool = False) -> dict:
    """Write a model folder for a GGUF file (written beside `out` first, then renamed into place, so a
    failed import leaves nothing behind). -> a summary for the CLI."""
    src, dst = Path(path), Path(out)
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    if dst.exists() and not overwrite:
        raise ModelLoadError(f"{dst}: already exists (pass --overwrite to replace it)")
    if dst.exists() and not dst.is_dir():
        raise ModelLoadError(f"{dst}: exists and is not a directory")
    reader = open_gguf(src)
    meta = metadata(reader)
    names = {t.name for t in reader.tensors}
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    cfg = hf_config(meta, names, len(tokens.data) if tokens is not None else None, str(src))
    args = ModelArgs.from_hf_config(cfg, where=f"{src} (metadata)")
    _, permuted = ARCHITECTURES[meta["general.architecture"]]
    tensors = convert_tensors(reader, args, permuted, DTYPES[dtype], str(src))
    cfg["torch_dtype"] = dtype
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        from safetensors.torch import save_file

        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt", "source": src.name})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        gen = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in cfg}
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
        files = save_tokenizer(src, tmp)
        sha = file_sha256(src)
        qtypes = sorted({t.tensor_type.name for t in reader.tensors})
        (tmp / "README.md").write_text(
            f"# {meta.get('general.name', src.stem)}\n\nImported by `python -m engine import-gguf` from `{src.name}` "
            f"(sha256 {sha}; tensor types {', '.join(qtypes)}), dequantised by the gguf package and stored as {dtype}.\n"
            f"License (from the file's metadata): {meta.get('general.license', 'not stated')}.\n")
        if dst.exists():
            shutil.rmtree(dst)
        tmp.rename(dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"out": str(dst), "architecture": meta["general.architecture"], "model_type": cfg["model_type"],
            "layers": args.n_layers, "hidden_size": args.dim, "vocab_size": args.vocab_size,
            "tie_word_embeddings": args.tie_word_embeddings, "tensors": len(tensors), "tensor_types": qtypes,
            "dtype": dtype, "sha256": sha, "tokenizer_files": sorted(files)}
