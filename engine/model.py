"""Our Llama-family decoder (gpt-fast style): static KV cache, explicit positions, block masks.

`Transformer.forward(tokens, positions, start, block_mask)` runs T new tokens whose K/V are written
to cache slots start..start+T-1; each token attends to the committed prefix [0, start) and to the
tokens of its own block that `block_mask[T, T]` allows (causal for prefill, the tree mask for a
Medusa step). Positions are explicit so tree nodes get prefix_len + depth. `start` is an int (one
length for the whole batch: prefill, training) or a [B] device tensor of per-request lengths.

How it runs is fixed when it is built (`loading.build_model`): the attention `backend`, and `fused`
(CUDA graphs on): q/k/v and gate/up stacked into one GEMM each, and the pointwise work done by the
Triton kernels in engine/kernels/ (their torch references are the unfused path); `gemm` (with
fused) says which GEMM runs the projections and the lm_head: cuBLAS, our skinny GEMM, or per shape whichever is
faster on this GPU (engine/gemm_choice.py).
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import AttentionContext, attention
from .config import ModelArgs, rope_inv_freq
from .gemm_choice import GemmChoice
from .kernels import compact, pointwise, rope
from .tp import SINGLE, TP


class KVCache(nn.Module):
    """K and V for all layers in two tensors [L, B, H_kv, S, D], so compaction is one indexed copy."""

    def __init__(self, args: ModelArgs, batch: int, capacity: int, device, dtype, kv_heads: int):
        super().__init__()
        shape = (args.n_layers, batch, kv_heads, capacity, args.head_dim)
        self.register_buffer("k", torch.zeros(shape, device=device, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(shape, device=device, dtype=dtype), persistent=False)

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    def compact(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Move slots src[b, i] -> dst[b, i] of request b for every layer (the accepted path after a
        tree step): one Triton launch on CUDA, its torch reference elsewhere."""
        if self.k.is_cuda and compact.triton is not None:
            compact.compact(self.k, self.v, src, dst)
        else:
            compact.compact_reference(self.k, self.v, src, dst)

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Finished requests leave the batch: the kept rows move to the front, in place (gathered
        first, so overlap is safe), and the model reads rows [:B] from then on. The tensors keep
        their addresses, so CUDA graphs captured for smaller batches stay valid."""
        n = rows.numel()
        self.k[:, :n] = self.k[:, rows]
        self.v[:, :n] = self.v[:, rows]


class RMSNorm(nn.Module):
    """Holds a norm's weight under its HF name; Transformer.forward applies it fused with the
    residual add before it."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))


def proj(layer: nn.Linear, x: torch.Tensor, gemm: GemmChoice | None) -> torch.Tensor:
    """A projection: the layer itself (cuBLAS on CUDA), or the GEMM that `gemm` chose for it."""
    return gemm.linear(layer, x) if gemm is not None else layer(x)


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


class Attention(nn.Module):
    """Under tensor parallelism this rank holds n_heads / world query heads and n_kv_heads / world
    KV heads; the caller all-reduces the output."""

    def __init__(self, args: ModelArgs, tp: TP = SINGLE):
        super().__init__()
        d, hd = args.dim, args.head_dim
        self.head_dim = hd
        self.n_heads, self.n_kv_heads = args.n_heads // tp.world, args.n_kv_heads // tp.world
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=args.qkv_bias)
        self.k_proj = nn.Linear(d, self.n_kv_heads * hd, bias=args.qkv_bias)
        self.v_proj = nn.Linear(d, self.n_kv_heads * hd, bias=args.qkv_bias)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=args.o_bias)
        self.qkv_proj: nn.Linear | None = None  # q, k and v in one GEMM after stack_projections()

    def stack_projections(self) -> None:
        """q/k/v become one Linear of their stacked weights: at batch 1 each projection is a GEMV too
        small to reach full memory bandwidth, and one launch replaces three."""
        self.qkv_proj = _stacked((self.q_proj, self.k_proj, self.v_proj))
        del self.q_proj, self.k_proj, self.v_proj

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope_cs, cache: KVCache | None, layer: int,
                ctx: AttentionContext | None, inv_freq: torch.Tensor, fused: bool, gemm: GemmChoice | None = None) -> torch.Tensor:
        b, t, _ = x.shape
        hd = self.head_dim
        if fused and cache is not None:  # one kernel: RoPE on q and k, k and v written into the cache
            start = ctx.start if isinstance(ctx.start, torch.Tensor) else torch.full((b,), ctx.start, device=x.device)
            q = rope.rope_qkv_to_cache(proj(self.qkv_proj, x, gemm), positions, inv_freq, cache.k[layer],
                                       cache.v[layer], start, self.n_heads, self.n_kv_heads)
        else:
            if self.qkv_proj is not None:
                q, k, v = self.qkv_proj(x).split([self.n_heads * hd, self.n_kv_heads * hd, self.n_kv_heads * hd], -1)
            else:
                q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            q = q.view(b, t, self.n_heads, hd).transpose(1, 2)
            k = k.view(b, t, self.n_kv_heads, hd).transpose(1, 2)
            v = v.view(b, t, self.n_kv_heads, hd).transpose(1, 2)
            q, k = rope.rope_reference(q, k, *rope_cs)
            if cache is None:  # training / scoring: no cache, causal within the block
                out = attention(q, k, v, AttentionContext("sdpa", 0, t, None))
                return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * hd))
            if isinstance(ctx.start, int):
                cache.k[layer, :b, :, ctx.start : ctx.start + t] = k
                cache.v[layer, :b, :, ctx.start : ctx.start + t] = v
            else:
                rope.write_cache_reference(cache.k[layer], cache.v[layer], k, v, ctx.start)
        out = attention(q, cache.k[layer, :b], cache.v[layer, :b], ctx)  # the triton kernel lays it out [B, T, H, D]
        return proj(self.o_proj, out.transpose(1, 2).reshape(b, t, self.n_heads * hd), gemm)


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs, tp: TP = SINGLE):
        super().__init__()
        inner = args.intermediate_size // tp.world
        self.gate_proj = nn.Linear(args.dim, inner, bias=args.mlp_bias)
        self.up_proj = nn.Linear(args.dim, inner, bias=args.mlp_bias)
        self.down_proj = nn.Linear(inner, args.dim, bias=args.mlp_bias)
        self.gate_up_proj: nn.Linear | None = None  # gate and up in one GEMM after stack_projections()

    def stack_projections(self) -> None:
        self.gate_up_proj = _stacked((self.gate_proj, self.up_proj))
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor, fused: bool, gemm: GemmChoice | None = None) -> torch.Tensor:
        if self.gate_up_proj is not None:
            gate_up = proj(self.gate_up_proj, x, gemm)
        else:
            gate_up = torch.cat((self.gate_proj(x), self.up_proj(x)), dim=-1)
        if gemm is not None:  # the fused path: the activation runs with the down projection's GEMM
            return gemm.gated_linear(self.down_proj, gate_up)
        act = pointwise.silu_mul(gate_up) if fused else pointwise.silu_mul_reference(gate_up)
        return self.down_proj(act)


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

    def __init__(self, args: ModelArgs, tp: TP = SINGLE, backend: str = "sdpa", fused: bool = False,
                 gemm: str = "cublas"):
        super().__init__()
        self.args, self.tp, self.backend, self.fused, self.gemm = args, tp, backend, fused, gemm
        self.gemm_choice: GemmChoice | None = None  # made at the first fused forward, once the weights are final
        self.embed_tokens = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args, tp) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim)
        self.lm_head = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(args), persistent=False)
        self.cache: KVCache | None = None

    def stack_projections(self) -> None:
        """q/k/v and gate/up each become one GEMM (after loading: checkpoints keep the HF names).
        Under tensor parallelism each rank stacks its own shards, so the split stays per rank."""
        for layer in self.layers:
            if layer.self_attn.qkv_proj is None:
                layer.self_attn.stack_projections()
                layer.mlp.stack_projections()

    def setup_cache(self, batch: int, capacity: int) -> KVCache:
        """A cache of at least this batch and capacity (an existing larger one is kept: CUDA graphs
        hold its addresses)."""
        w = self.embed_tokens.weight
        if self.cache is None or self.cache.capacity < capacity or self.cache.batch < batch:
            self.cache = None  # free the old one before allocating the new one
            self.cache = KVCache(self.args, batch, capacity, w.device, w.dtype, self.args.n_kv_heads // self.tp.world)
        return self.cache

    def _gemm_choice(self) -> GemmChoice | None:
        """None (each projection its own Linear: cuBLAS) unless `gemm` asks for more; made once, over the
        stacked projections (every layer's, so `auto` times a shape over all of them) and the lm_head, unless
        under tensor parallelism (`logits`)."""
        if self.gemm == "cublas":
            return None
        if self.gemm_choice is None:
            projections = [p for layer in self.layers
                           for p in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                                     layer.mlp.down_proj)]
            self.gemm_choice = GemmChoice(self.gemm, projections + ([] if self.tp.collective else [self.lm_head]))
        return self.gemm_choice

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """lm_head(hidden) in the model's dtype; on the fused path through the GEMM chosen for it (at a 7B
        shape's batch-1 step the lm_head is the largest single weight read). Not under tensor parallelism:
        the lm_head is replicated, and every rank must compute the same logits (engine/tp.py), where each
        rank would time and tune its own kernel (the sharded projections are summed by an all-reduce)."""
        return proj(self.lm_head, hidden, self._gemm_choice() if self.fused and not self.tp.collective else None)

    def _norm(self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, fused: bool):
        """-> (x + residual, RMSNorm of it): one kernel on the fused path (x updated in place there)."""
        eps = self.args.norm_eps
        if fused:
            return pointwise.add_rms_norm(x, residual, weight, eps)
        if residual is None:
            return x, pointwise.rms_norm_reference(x, weight, eps)
        return pointwise.add_rms_norm_reference(x, residual, weight, eps)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        start: int | torch.Tensor = 0,
        block_mask: torch.Tensor | None = None,
        use_cache: bool = True,
        span: int | None = None,
        tree_bits: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tokens, positions [B, T] -> final-normed hidden states [B, T, dim] (feed lm_head or heads).

        With per-request `start` [B], `span` (a host int >= max(start) + T) bounds the cache slots read.
        `tree_bits`: block_mask already packed on the device (TreeBuffers.mask_bits), so the triton
        backend needs no host-to-device copy (required inside a CUDA graph).
        """
        b, t = tokens.shape
        x = self.embed_tokens(tokens)
        positions = positions if positions.dim() == 2 else positions[None].expand(b, -1)
        cache = self.cache if use_cache else None
        fused = self.fused and cache is not None
        ctx = None
        if cache is not None:
            if isinstance(start, torch.Tensor) and span is None:
                raise ValueError("per-request start needs span (max(start) + T, a host int)")
            span = span if isinstance(start, torch.Tensor) else start + t
            a = self.args
            ctx = AttentionContext.build(self.backend, start, t, span, block_mask, tree_bits, a.n_heads // a.n_kv_heads,
                                         x.device, batch=b)
        rope_cs = None if fused else rope.rope_tables(positions, self.inv_freq, x.dtype)
        # x += attn(norm(x)); x += mlp(norm(x)); ... norm(x), each residual add fused into the next norm
        first = self.layers[0].input_layernorm if len(self.layers) else self.norm
        x, h = self._norm(x, None, first.weight, fused)
        gemm = self._gemm_choice() if fused else None
        for i, layer in enumerate(self.layers):
            out = self.tp.all_reduce(layer.self_attn(h, positions, rope_cs, cache, i, ctx, self.inv_freq, fused, gemm))
            x, h = self._norm(x, out, layer.post_attention_layernorm.weight, fused)
            out = self.tp.all_reduce(layer.mlp(h, fused, gemm))
            nxt = self.layers[i + 1].input_layernorm if i + 1 < len(self.layers) else self.norm
            x, h = self._norm(x, out, nxt.weight, fused)
        return h
