"""Our Llama-family decoder (gpt-fast style): static KV cache, explicit positions, block masks.

`Transformer.forward(tokens, positions, start, block_mask)` runs T new tokens whose K/V are written
to cache slots start..start+T-1; each token attends to the committed prefix [0, start) and to the
tokens of its own block that `block_mask[T, T]` allows (causal for prefill, the tree mask for a
Medusa step). Positions are explicit so tree nodes get prefix_len + depth. `start` is an int (one
length for the whole batch: prefill, training) or a [B] device tensor of per-request lengths
(decoding a batch whose requests have committed different numbers of tokens).
"""

from __future__ import annotations

import torch
from torch import nn

from trees import pack_mask_bits

from . import fused
from .attention import attention, batch_mask, causal_bits, full_mask
from .config import ModelArgs, rope_inv_freq
from .tp import SINGLE, TP


def compact_reference(k: torch.Tensor, v: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """k, v [L, B_cap, H, S, D]; src, dst [B, n]: slot src[b, i] -> dst[b, i] of request b in every
    layer and head, as two gathers then two scatters. A row may repeat its last pair as padding."""
    rows = torch.arange(src.shape[0], device=src.device)[:, None]
    gathered_k, gathered_v = k[:, rows, :, src], v[:, rows, :, src]  # [B, n, L, H, D]
    k[:, rows, :, dst] = gathered_k
    v[:, rows, :, dst] = gathered_v


class KVCache(nn.Module):
    """K and V for all layers in two tensors [L, B, H_kv, S, D], so compaction is one indexed copy."""

    def __init__(self, args: ModelArgs, batch: int, capacity: int, device, dtype, kv_heads: int | None = None):
        super().__init__()
        shape = (args.n_layers, batch, kv_heads or args.n_kv_heads, capacity, args.head_dim)
        self.register_buffer("k", torch.zeros(shape, device=device, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(shape, device=device, dtype=dtype), persistent=False)

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def compact(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Move slots src[b, i] -> dst[b, i] of request b for every layer (the accepted path after a
        tree step). Gather first, then write: the ranges may overlap. On CUDA one Triton launch
        (engine/kernels/compact.py), elsewhere its torch reference."""
        if self.k.is_cuda:
            from .kernels.compact import compact

            compact(self.k, self.v, src, dst)
        else:
            compact_reference(self.k, self.v, src, dst)

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Finished requests leave the batch: the kept rows move to the front, in place (gathered
        first, so overlap is safe), and the model reads rows [:B] from then on. The tensors keep
        their addresses, so CUDA graphs captured for smaller batches stay valid."""
        n = rows.numel()
        self.k[:, :n] = self.k[:, rows]
        self.v[:, :n] = self.v[:, rows]


class RMSNorm(nn.Module):
    """Holds a norm's weight under its HF name; Transformer.forward applies it (engine/fused.py),
    fused with the residual add before it."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))


class Attention(nn.Module):
    """Under tensor parallelism this rank holds n_heads / world query heads and n_kv_heads / world
    KV heads; the caller all-reduces the output."""

    def __init__(self, args: ModelArgs, tp: TP = SINGLE):
        super().__init__()
        self.args = args
        d, hd = args.dim, args.head_dim
        self.n_heads, self.n_kv_heads = args.n_heads // tp.world, args.n_kv_heads // tp.world
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=args.qkv_bias)
        self.k_proj = nn.Linear(d, self.n_kv_heads * hd, bias=args.qkv_bias)
        self.v_proj = nn.Linear(d, self.n_kv_heads * hd, bias=args.qkv_bias)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=args.o_bias)
        self.qkv_proj: nn.Linear | None = None  # q, k and v in one GEMM after fuse_projections()

    def fuse_projections(self) -> None:
        """Replace q/k/v by one Linear of their stacked weights: at batch 1 each projection is a
        GEMV too small to reach full memory bandwidth, and one launch replaces three."""
        parts = (self.q_proj, self.k_proj, self.v_proj)
        self.qkv_proj = _stacked(parts)
        del self.q_proj, self.k_proj, self.v_proj

    def forward(self, x, cos, sin, cache: KVCache | None, layer: int, start, block_mask, backend: str,
                dense_mask: torch.Tensor | None = None, span: int = 0, fuse: bool = False):
        b, t, _ = x.shape
        hd = self.args.head_dim
        if self.qkv_proj is not None:
            q, k, v = self.qkv_proj(x).split([self.n_heads * hd, self.n_kv_heads * hd, self.n_kv_heads * hd], -1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(b, t, self.n_heads, hd).transpose(1, 2)
        k = k.view(b, t, self.n_kv_heads, hd).transpose(1, 2)
        v = v.view(b, t, self.n_kv_heads, hd).transpose(1, 2)
        q, k = fused.op("rope", fuse)(q, k, cos, sin)
        if cache is None:  # training / scoring: no cache, attend within the block only
            out = attention(q, k, v, 0, block_mask, backend="sdpa")
        elif isinstance(start, int):
            cache.k[layer, :b, :, start : start + t] = k
            cache.v[layer, :b, :, start : start + t] = v
            out = attention(q, cache.k[layer, :b], cache.v[layer, :b], start, block_mask, backend, dense_mask, fuse)
        else:  # per-request lengths: request r writes slots start[r] .. start[r]+t-1
            rows = torch.arange(b, device=x.device)[:, None]
            slots = start[:, None] + torch.arange(t, device=x.device)
            cache.k[layer][rows, :, slots] = k.transpose(1, 2)
            cache.v[layer][rows, :, slots] = v.transpose(1, 2)
            out = attention(q, cache.k[layer, :b, :, :span], cache.v[layer, :b, :, :span], start, block_mask, backend,
                            dense_mask, fuse)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * hd))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs, tp: TP = SINGLE):
        super().__init__()
        inner = args.intermediate_size // tp.world
        self.gate_proj = nn.Linear(args.dim, inner, bias=args.mlp_bias)
        self.up_proj = nn.Linear(args.dim, inner, bias=args.mlp_bias)
        self.down_proj = nn.Linear(inner, args.dim, bias=args.mlp_bias)
        self.gate_up_proj: nn.Linear | None = None  # gate and up in one GEMM after fuse_projections()

    def fuse_projections(self) -> None:
        self.gate_up_proj = _stacked((self.gate_proj, self.up_proj))
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor, fuse: bool = False) -> torch.Tensor:
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(fused.op("silu_mul", fuse)(gate, up))


def _stacked(parts: tuple[nn.Linear, ...]) -> nn.Linear:
    """One Linear whose output is the parts' outputs concatenated (same device and dtype)."""
    w = parts[0].weight
    out = nn.Linear(w.shape[1], sum(p.out_features for p in parts), bias=parts[0].bias is not None,
                    device=w.device, dtype=w.dtype)
    with torch.no_grad():
        out.weight.copy_(torch.cat([p.weight for p in parts]))
        if out.bias is not None:
            out.bias.copy_(torch.cat([p.bias for p in parts]))
    return out.requires_grad_(False)


class Block(nn.Module):
    def __init__(self, args: ModelArgs, tp: TP = SINGLE):
        super().__init__()
        self.self_attn = Attention(args, tp)
        self.mlp = FeedForward(args, tp)
        self.input_layernorm = RMSNorm(args.dim)
        self.post_attention_layernorm = RMSNorm(args.dim)


class Transformer(nn.Module):
    """Parameter names follow the HF layout (`model.` stripped) so checkpoints load by name.
    With `tp` this is one rank's shard (engine/tp.py says what is split and how)."""

    def __init__(self, args: ModelArgs, tp: TP = SINGLE):
        super().__init__()
        self.args, self.tp = args, tp
        self.embed_tokens = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args, tp) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim)
        self.lm_head = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(args), persistent=False)
        self.cache: KVCache | None = None
        self.backend = "sdpa"
        self.fused = False  # pointwise ops compiled into single kernels (engine/fused.py; CUDA graphs turn it on)

    def fuse_projections(self) -> None:
        """q/k/v and gate/up each become one GEMM (after loading: checkpoints keep the HF names).
        Under tensor parallelism each rank stacks its own shards, so the split stays per rank."""
        for layer in self.layers:
            if layer.self_attn.qkv_proj is None:
                layer.self_attn.fuse_projections()
                layer.mlp.fuse_projections()

    def setup_cache(self, batch: int, capacity: int) -> KVCache:
        w = self.embed_tokens.weight
        if self.cache is None or self.cache.capacity < capacity or self.cache.k.shape[1] < batch:
            self.cache = None  # free the old one before allocating the new one
            self.cache = KVCache(self.args, batch, capacity, w.device, w.dtype, self.args.n_kv_heads // self.tp.world)
        return self.cache

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.float()[..., None] * self.inv_freq  # [B, T, D/2]
        emb = torch.cat((angles, angles), dim=-1)
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]  # [B, 1, T, D]

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        start: int | torch.Tensor = 0,
        block_mask: torch.Tensor | None = None,
        use_cache: bool = True,
        span: int | None = None,
        mask_bits: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tokens, positions [B, T] -> final-normed hidden states [B, T, dim] (feed lm_head or heads).

        With per-request `start` [B], `span` (a host int >= max(start) + T) bounds the cache slots read.
        `mask_bits`: block_mask already packed on the device (TreeBuffers.mask_bits), so the triton
        backend needs no host-to-device copy (required inside a CUDA graph).
        """
        x = self.embed_tokens(tokens)
        if positions.dim() == 1:
            positions = positions[None].expand(tokens.shape[0], -1)
        cos, sin = self.rope(positions, x.dtype)
        cache = self.cache if use_cache else None
        t = tokens.shape[1]
        per_request = isinstance(start, torch.Tensor)
        if per_request and span is None:
            raise ValueError("per-request start needs span (max(start) + T, a host int)")
        a = self.args
        dense = None  # the mask is the same in every layer: build it once per forward
        if cache is not None and self.backend == "sdpa" and per_request:
            dense = batch_mask(start, block_mask, t, span, a.n_heads // a.n_kv_heads)
        elif cache is not None and self.backend == "sdpa" and (start > 0 or block_mask is not None):
            dense = full_mask(start, block_mask, t, x.device, a.n_heads // a.n_kv_heads)
        elif cache is not None and self.backend == "triton":
            if mask_bits is not None:
                dense = mask_bits
            elif block_mask is None:
                dense = causal_bits(t, x.device)
            else:
                dense = pack_mask_bits(block_mask.cpu()).to(x.device)
        # x += attn(norm(x)); x += mlp(norm(x)); ... norm(x), with each residual add fused into the next norm
        add_norm = fused.op("add_rms_norm", self.fused)
        eps = a.norm_eps
        h = fused.op("rms_norm", self.fused)(x, (self.layers[0].input_layernorm if self.layers else self.norm).weight, eps)
        for i, layer in enumerate(self.layers):
            out = self.tp.all_reduce(layer.self_attn(h, cos, sin, cache, i, start, block_mask, self.backend, dense,
                                                     span or 0, self.fused))
            x, h = add_norm(x, out, layer.post_attention_layernorm.weight, eps)
            out = self.tp.all_reduce(layer.mlp(h, self.fused))
            nxt = self.layers[i + 1].input_layernorm if i + 1 < len(self.layers) else self.norm
            x, h = add_norm(x, out, nxt.weight, eps)
        return h
