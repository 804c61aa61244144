"""Oracle drafts: Medusa heads that know the greedy continuation, for tests and for measuring the
engine at the sizes Medusa exists for without trained heads.

`OracleHeads` maps a hidden state to its position in known AR sequences (nearest neighbour among
their hidden states) and proposes, for head k, the token AR wrote k+2 places later at a chosen rank
(or not at all). Verification, compaction, graphs and host work all run for real; only the draft's
quality is set. `bench --part e2e --shape llama2-7b` uses it on a random-weight 7B-shape model with
per-head rank distributions measured on the demo model (docs/algorithm.md), on weights that
`make_decisive` makes robust to bf16 rounding (`oracle_engine`; `bench --part batch --shape` too).
"""

from __future__ import annotations

import torch
from torch import nn


class OracleHeads(nn.Module):
    """Drop-in for MedusaHeads (`forward(h, lm_head_weight, out=None) -> [K, N, V]`). `table` [M, d]: hidden states
    of known positions; `targets` [M, K]: the token k+2 places after each (-1 past the end); `ranks`
    [M, K]: where head k puts it (0 = top-1; -1 = not in its top-k). Decoys fill the ranks above.
    `cost`: real heads of the size being measured (e.g. random MedusaHeads), run every step and their
    logits overwritten, so that a step pays what real heads cost; None: the oracle's own work only."""

    shared_lm_head = True
    num_layers = 1

    def __init__(self, table: torch.Tensor, targets: torch.Tensor, ranks: torch.Tensor, vocab: int,
                 cost: nn.Module | None = None):
        super().__init__()
        self.num_heads = targets.shape[1]
        self.cost = cost
        self.register_buffer("table", table.float())
        self.register_buffer("targets", targets.long())
        self.register_buffer("ranks", ranks.long())
        self.register_buffer("noise", torch.rand(self.num_heads, vocab, generator=torch.Generator().manual_seed(0)))
        self.vocab = vocab
        self.max_rank = int(ranks.max().clamp(min=0))  # a host int: forward runs inside CUDA graphs

    def forward(self, h: torch.Tensor, lm_head_weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Gathers and scatters only (no boolean indexing, so no host sync): it runs inside CUDA graphs.
        Into `out` when given, as MedusaHeads.forward."""
        idx = torch.cdist(h.float(), self.table.to(h.device)).argmin(1)  # [N]: the position each state is at
        tgt, rnk = self.targets[idx].T, self.ranks[idx].T  # [K, N]
        noise = self.noise[:, None, :].expand(-1, h.shape[0], -1)  # [K, N, V] in [0, 1)
        if self.cost is not None:
            logits = self.cost(h, lm_head_weight, out=out).copy_(noise)
        else:
            logits = noise.to(h.dtype).clone() if out is None else out.copy_(noise)
        known = tgt >= 0
        where = tgt.clamp(min=0)[..., None]  # [K, N, 1]; rows without a target rewrite index 0 unchanged

        def put(index, value, active):
            logits.scatter_(-1, index, torch.where(active[..., None], value.to(logits.dtype), logits.gather(-1, index)))

        put(where, torch.where(rnk >= 0, 10.0, -10.0)[..., None], known)  # shown at its rank, or below every candidate
        for j in range(self.max_rank):  # decoys above the target
            put((where + 1 + j) % self.vocab, torch.full_like(logits[..., :1], 20.0 - j), known & (rnk > j))
        return logits


@torch.no_grad()
def oracle_for(model, sequences: list[list[int]], starts: list[int], num_heads: int, rank_of,
               cost: nn.Module | None = None) -> OracleHeads:
    """OracleHeads for full sequences (prompt + AR continuation); `starts[i]`: where sequence i's
    output begins; `rank_of(sequence, output_index, head) -> rank or -1`; `cost`: as OracleHeads'."""
    tables, targets, ranks = [], [], []
    dev = model.embed_tokens.weight.device
    for i, (seq, s0) in enumerate(zip(sequences, starts)):
        h = model(torch.tensor([seq], device=dev), torch.arange(len(seq), device=dev), use_cache=False)[0]
        for p in range(s0 - 1, len(seq)):
            tables.append(h[p])
            targets.append([seq[p + 2 + k] if p + 2 + k < len(seq) else -1 for k in range(num_heads)])
            ranks.append([rank_of(i, p - s0 + 1, k) for k in range(num_heads)])
    return OracleHeads(torch.stack(tables), torch.tensor(targets), torch.tensor(ranks),
                       model.args.vocab_size, cost).to(dev)


RESERVED = 100  # token ids a decisive model never produces (specials, EOS); its prompts avoid them too


@torch.no_grad()
def make_decisive(hf_model, residual_scale: float = 1e-5, reserved: int = RESERVED, seed: int = 0) -> torch.Tensor:
    """Rewrites a random-weight transformers Llama in place so that its greedy next token is a fixed
    permutation of the current one, by a wide margin; returns the permutation (`succ[t]`).

    Why: with plain random weights the logits are near-tied, so a tree step and an AR step (other
    kernel shapes, other summation orders) round to different argmaxes within tens of bf16 tokens,
    and an oracle built from the AR continuation stops matching. Here every layer still runs on
    full-size weights (the timing is the model's), but the attention and MLP outputs are scaled by
    `residual_scale`, so the final hidden state is the current token's embedding; lm_head row
    succ[t] is that embedding normalised, so the winning logit is |u|^2 ~ d against ~4 sqrt(d) for
    the best of the rest (it wins by at least half its value; at d = 4096 by ~0.9). In float16 the
    scaled weights are subnormal: what they add is lost, as intended. Tokens below `reserved`
    (specials, EOS) are never produced; prompts must not use them either (succ is -1 there: their
    next token is not decided)."""
    inner = hf_model.model
    if hf_model.lm_head.weight.data_ptr() == inner.embed_tokens.weight.data_ptr():
        raise ValueError("make_decisive needs untied embeddings: lm_head is rewritten, the embeddings must stay")
    for layer in inner.layers:
        layer.self_attn.o_proj.weight.mul_(residual_scale)
        layer.mlp.down_proj.weight.mul_(residual_scale)
    emb = inner.embed_tokens.weight
    vocab = emb.shape[0]
    g = torch.Generator().manual_seed(seed)
    succ = torch.full((vocab,), -1, dtype=torch.long)
    succ[reserved:] = reserved + torch.randperm(vocab - reserved, generator=g)
    unit = emb.float() * torch.rsqrt(emb.float().pow(2).mean(-1, keepdim=True) + 1e-6) * inner.norm.weight.float()
    head = torch.zeros_like(hf_model.lm_head.weight, dtype=torch.float32)
    head[succ[reserved:].to(emb.device)] = 0.02 * unit[reserved:]
    hf_model.lm_head.weight.copy_(head)
    return succ


def sampled_ranks(rank_probs: list[list[float]], seed: int = 0):
    """rank_of(sequence, position, head) drawn once per (sequence, position, head) from
    rank_probs[head][rank] (the rest of the mass: a miss), deterministically. Per sequence: drawn per
    position only, every prompt would accept the same lengths at the same steps (a batch would never
    go ragged, and four prompts would be one draw)."""
    import random

    cache: dict[tuple[int, int, int], int] = {}

    def rank_of(i: int, p: int, k: int) -> int:
        if (i, p, k) not in cache:
            u = random.Random(((seed * 1_000_003 + i) * 1_000_033 + p) * 131 + k).random()
            r, acc = -1, 0.0
            for j, q in enumerate(rank_probs[k]):
                acc += q
                if u < acc:
                    r = j
                    break
            cache[(i, p, k)] = r
        return cache[(i, p, k)]

    return rank_of


def oracle_engine(shape: str, prompts: int, prompt_len: int, max_new: int, backend: str, gemm: str = "cublas",
                  dtype: str = "bfloat16", device: str = "cuda"):
    """An Engine (CUDA graphs on CUDA) on a decisive random-weight model of a real shape (bench/step.py's SHAPES)
    with oracle drafts for `prompts` random prompts: their AR greedy continuations are computed first,
    then each head proposes its token at a rank drawn from the demo model's measured per-head rank
    distribution (else misses). Verification, compaction, graphs and host work are real, and every
    step also runs four random FasterDecoding-format heads (ResBlock + own lm_head) whose logits the
    oracle overwrites: only the draft's quality is set. The weights are decisive (`make_decisive`):
    with plain random bf16 weights the logits are near-tied, tree and AR steps round to different
    tokens within tens of tokens and the oracle stops matching.
    -> (the transformers model on the same weights, the engine, the prompts' ids, what the JSON says of it)."""
    import trees

    from ..engine import Engine
    from ..generation import GenerationConfig
    from ..heads import MedusaHeads
    from ..loading import DEMO_DIR
    from .step import random_pair

    cuda = device.startswith("cuda")
    hf, model = random_pair(shape, backend, fused=cuda, gemm=gemm, dtype=dtype, decisive=True, device=device)
    eng = Engine(model, None, None, shape, "oracle", cuda_graphs=cuda)
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(RESERVED, model.args.vocab_size, (prompt_len,), generator=g).tolist() for _ in range(prompts)]
    cfg = GenerationConfig(max_new_tokens=max_new, mode="ar", stop_on_eos=False)
    ar_out = [eng.generate(p, config=cfg).token_ids for p in ids]
    demo = trees.ar_runs(trees.read_runs(DEMO_DIR / "tune_traces.jsonl"))
    acc = trees.head_stats([v for r in demo for v in r.vectors], 4, topk=10).accuracy()
    heads = MedusaHeads(4, 1, model.args.dim, model.args.vocab_size).to(device, getattr(torch, dtype))
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.02)
    eng.heads = oracle_for(model, [p + o for p, o in zip(ids, ar_out)], [len(p) for p in ids], 4, sampled_ranks(acc),
                           cost=heads)
    keys = [t for p, o in zip(ids, ar_out) for t in [p[-1], *o]]
    about = {"shape": shape, "weights": f"random ({dtype}), made decisive (bench/oracle.py make_decisive)",
             "draft": "oracle heads: each head's rank of the true token drawn from the demo model's per-head rank "
             "distribution (tune traces); misses otherwise. Each step also runs 4 random FasterDecoding heads "
             "(ResBlock + own lm_head) for their cost",
             "oracle_positions_distinct": len(set(keys)) == len(keys),
             "head_top1_used": [round(a[0], 3) for a in acc], "prompts": prompts, "prompt_len": prompt_len,
             "max_new_tokens": max_new, "backend": backend, "cuda_graphs": cuda, "gemm": model.gemm,
             "device": device}
    return hf, eng, ids, about
