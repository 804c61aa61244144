"""Model shape and RoPE settings read from a Hugging Face `config.json` (Llama, Mistral, Qwen2)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

SUPPORTED_ARCHITECTURES = {"llama", "mistral", "qwen2"}


class ModelLoadError(ValueError):
    """A model or heads checkpoint cannot be used; the message names the file or key."""


@dataclass
class ModelArgs:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict = field(default_factory=dict)
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    model_type: str = "llama"
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    @classmethod
    def from_hf_config(cls, cfg: object, where: str = "config.json") -> ModelArgs:
        """Read and check a transformers config dict: every size a positive integer within LIMITS
        (checked before anything is allocated), the architecture and RoPE type ones we implement."""
        if not isinstance(cfg, dict):
            raise ModelLoadError(f"{where}: expected a JSON object, got {type(cfg).__name__}")
        model_type = cfg.get("model_type", "")
        if model_type not in SUPPORTED_ARCHITECTURES:
            archs = cfg.get("architectures")
            raise ModelLoadError(
                f"{where}: model_type {model_type!r} ({archs}) is not supported; "
                f"supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
            )
        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
            if key not in cfg:
                raise ModelLoadError(f"{where}: missing {key!r}")
        required = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
        size = {key: _size(cfg, key, where) for key in LIMITS if key in required or cfg.get(key) is not None}
        n_heads = size["num_attention_heads"]
        n_kv = size.get("num_key_value_heads") or n_heads
        if n_heads % n_kv:
            raise ModelLoadError(f"{where}: num_attention_heads {n_heads} is not a multiple of num_key_value_heads {n_kv}")
        head_dim = size.get("head_dim") or size["hidden_size"] // n_heads
        if head_dim < 1 or head_dim % 2:
            raise ModelLoadError(f"{where}: head_dim {head_dim} must be a positive even number (RoPE rotates pairs)")
        # transformers 5 writes rope settings under rope_parameters; older files use rope_theta/rope_scaling
        rope = cfg.get("rope_parameters") or {}
        scaling = cfg.get("rope_scaling") or {}
        if not isinstance(rope, dict) or not isinstance(scaling, dict):
            raise ModelLoadError(f"{where}: rope_parameters / rope_scaling must be JSON objects")
        scaling = {**scaling, **rope}
        theta = _number(scaling.pop("rope_theta", cfg.get("rope_theta", 10000.0)), "rope_theta", where)
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type not in ("default", "linear", "llama3"):
            raise ModelLoadError(f"{where}: rope_type {rope_type!r} is not supported (default, linear, llama3)")
        scaling["rope_type"] = rope_type
        needed = {"linear": ("factor",), "llama3": ("factor", "original_max_position_embeddings")}.get(rope_type, ())
        for key in needed:
            if key not in scaling:
                raise ModelLoadError(f"{where}: {rope_type} RoPE scaling needs {key!r}")
        if rope_type == "llama3":  # transformers' defaults for the two optional factors
            scaling.setdefault("low_freq_factor", 1.0)
            scaling.setdefault("high_freq_factor", 4.0)
        for key in ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"):
            if key in needed or (rope_type == "llama3" and key in scaling):
                scaling[key] = _number(scaling[key], f"rope {key}", where)
        if rope_type == "llama3" and not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
            raise ModelLoadError(f"{where}: llama3 RoPE needs high_freq_factor > low_freq_factor, got "
                                 f"{scaling['high_freq_factor']} and {scaling['low_freq_factor']}")
        flags = {key: _flag(cfg, key, default, where) for key, default in (
            ("tie_word_embeddings", False), ("attention_bias", False), ("mlp_bias", False),
            ("use_sliding_window", model_type == "mistral"))}
        bos = cfg.get("bos_token_id")
        if bos is not None and (isinstance(bos, bool) or not isinstance(bos, int)):
            raise ModelLoadError(f"{where}: bos_token_id must be an integer or null, got {bos!r}")
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        if not all(isinstance(e, int) and not isinstance(e, bool) for e in eos_ids):
            raise ModelLoadError(f"{where}: eos_token_id must be an integer or a list of integers")
        window = cfg.get("sliding_window") if flags["use_sliding_window"] else None
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
            raise ModelLoadError(f"{where}: sliding_window must be a positive integer or null")
        return cls(
            vocab_size=size["vocab_size"],
            dim=size["hidden_size"],
            n_layers=size["num_hidden_layers"],
            n_heads=n_heads,
            n_kv_heads=n_kv,
            head_dim=head_dim,
            intermediate_size=size["intermediate_size"],
            norm_eps=_number(cfg.get("rms_norm_eps", 1e-5), "rms_norm_eps", where),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=size.get("max_position_embeddings", 2048),
            tie_word_embeddings=flags["tie_word_embeddings"],
            qkv_bias=model_type == "qwen2" or flags["attention_bias"],
            o_bias=model_type != "qwen2" and flags["attention_bias"],
            mlp_bias=flags["mlp_bias"],
            sliding_window=window,
            model_type=model_type,
            eos_token_ids=eos_ids,
            bos_token_id=bos,
        )


# Largest sizes accepted from a config.json: several times today's largest open models, and small
# enough that a hostile file cannot make the loader spin or allocate (10**7 layers hung it once).
LIMITS = {"vocab_size": 2**22, "hidden_size": 65536, "num_hidden_layers": 1024, "num_attention_heads": 1024,
          "num_key_value_heads": 1024, "head_dim": 1024, "intermediate_size": 2**20, "max_position_embeddings": 2**24}


def _size(cfg: dict, key: str, where: str) -> int:
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= LIMITS[key]:
        raise ModelLoadError(f"{where}: {key} must be an integer in [1, {LIMITS[key]}], got {v!r}")
    return v


def _flag(cfg: dict, key: str, default: bool, where: str) -> bool:
    """A true/false setting: JSON true or false only, as transformers' typed configs require (the
    string "false" is truthy in Python, and was once read as true)."""
    v = cfg.get(key, default)
    if not isinstance(v, bool):
        raise ModelLoadError(f"{where}: {key} must be true or false, got {v!r}")
    return v


def _number(v: object, key: str, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ModelLoadError(f"{where}: {key} must be a positive number, got {v!r}")
    return float(v)


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """Inverse frequencies [head_dim/2] (float32), with linear or Llama-3 scaling applied."""
    d = args.head_dim
    inv = 1.0 / (args.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = args.rope_scaling
    kind = s.get("rope_type", "default")
    if kind == "linear":
        inv = inv / float(s["factor"])
    elif kind == "llama3":
        factor = float(s["factor"])
        low, high = float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
        old_ctx = float(s["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        smooth = (old_ctx / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
        inv = torch.where(mid, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    return inv
