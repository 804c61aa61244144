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
    def from_hf_config(cls, cfg: dict, where: str = "config.json") -> ModelArgs:
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
        n_heads = cfg["num_attention_heads"]
        n_kv = cfg.get("num_key_value_heads") or n_heads
        if n_heads % n_kv:
            raise ModelLoadError(f"{where}: num_attention_heads {n_heads} is not a multiple of num_key_value_heads {n_kv}")
        # transformers 5 writes rope settings under rope_parameters; older files use rope_theta/rope_scaling
        rope = dict(cfg.get("rope_parameters") or {})
        scaling = dict(cfg.get("rope_scaling") or {})
        theta = rope.pop("rope_theta", cfg.get("rope_theta", 10000.0))
        scaling.update(rope)
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type not in ("default", "linear", "llama3"):
            raise ModelLoadError(f"{where}: rope_type {rope_type!r} is not supported (default, linear, llama3)")
        scaling["rope_type"] = rope_type
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        window = cfg.get("sliding_window") if cfg.get("use_sliding_window", model_type == "mistral") else None
        return cls(
            vocab_size=cfg["vocab_size"],
            dim=cfg["hidden_size"],
            n_layers=cfg["num_hidden_layers"],
            n_heads=n_heads,
            n_kv_heads=n_kv,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // n_heads,
            intermediate_size=cfg["intermediate_size"],
            norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=float(theta),
            rope_scaling=scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
            o_bias=model_type != "qwen2" and bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            sliding_window=window,
            model_type=model_type,
            eos_token_ids=eos_ids,
            bos_token_id=cfg.get("bos_token_id"),
        )


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
