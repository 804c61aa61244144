"""Oracle drafts: Medusa heads that know the greedy continuation, for tests and for measuring the
engine at the sizes Medusa exists for without trained heads.

`OracleHeads` maps a hidden state to its position in known AR sequences (nearest neighbour among
their hidden states) and proposes, for head k, the token AR wrote k+2 places later at a chosen rank
(or not at all). Verification, compaction, graphs and host work all run for real; only the draft's
quality is set. `bench --part e2e --shape llama2-7b` uses it on a random-weight 7B-shape model with
per-head rank distributions measured on the demo model (docs/algorithm.md).
"""

from __future__ import annotations

import torch
from torch import nn


class OracleHeads(nn.Module):
    """Drop-in for MedusaHeads (`forward(h, lm_head_weight) -> [K, N, V]`). `table` [M, d]: hidden states
    of known positions; `targets` [M, K]: the token k+2 places after each (-1 past the end); `ranks`
    [M, K]: where head k puts it (0 = top-1; -1 = not in its top-k). Decoys fill the ranks above."""

    shared_lm_head = True
    num_layers = 1

    def __init__(self, table: torch.Tensor, targets: torch.Tensor, ranks: torch.Tensor, vocab: int):
        super().__init__()
        self.num_heads = targets.shape[1]
        self.register_buffer("table", table.float())
        self.register_buffer("targets", targets.long())
        self.register_buffer("ranks", ranks.long())
        self.register_buffer("noise", torch.rand(self.num_heads, vocab, generator=torch.Generator().manual_seed(0)))
        self.vocab = vocab
        self.max_rank = int(ranks.max().clamp(min=0))  # a host int: forward runs inside CUDA graphs

    def forward(self, h: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
        """Gathers and scatters only (no boolean indexing, so no host sync): it runs inside CUDA graphs."""
        idx = torch.cdist(h.float(), self.table.to(h.device)).argmin(1)  # [N]: the position each state is at
        tgt, rnk = self.targets[idx].T, self.ranks[idx].T  # [K, N]
        n = h.shape[0]
        logits = self.noise[:, None, :].expand(-1, n, -1).clone()  # [K, N, V] in [0, 1)
        known = tgt >= 0
        where = tgt.clamp(min=0)[..., None]  # [K, N, 1]; rows without a target rewrite index 0 unchanged

        def put(index, value, active):
            logits.scatter_(-1, index, torch.where(active[..., None], value, logits.gather(-1, index)))

        put(where, torch.where(rnk >= 0, 10.0, -10.0)[..., None], known)  # shown at its rank, or below every candidate
        for j in range(self.max_rank):  # decoys above the target
            put((where + 1 + j) % self.vocab, torch.full_like(logits[..., :1], 20.0 - j), known & (rnk > j))
        return logits.to(h.dtype)


@torch.no_grad()
def oracle_for(model, sequences: list[list[int]], starts: list[int], num_heads: int, rank_of) -> OracleHeads:
    """OracleHeads for full sequences (prompt + AR continuation); `starts[i]`: where sequence i's
    output begins; `rank_of(output_index, head) -> rank or -1`."""
    tables, targets, ranks = [], [], []
    dev = model.embed_tokens.weight.device
    for seq, s0 in zip(sequences, starts):
        h = model(torch.tensor([seq], device=dev), torch.arange(len(seq), device=dev), use_cache=False)[0]
        for p in range(s0 - 1, len(seq)):
            tables.append(h[p])
            targets.append([seq[p + 2 + k] if p + 2 + k < len(seq) else -1 for k in range(num_heads)])
            ranks.append([rank_of(p - s0 + 1, k) for k in range(num_heads)])
    return OracleHeads(torch.stack(tables), torch.tensor(targets), torch.tensor(ranks),
                       model.args.vocab_size).to(dev)


def sampled_ranks(rank_probs: list[list[float]], seed: int = 0):
    """rank_of(position, head) drawn once per (position, head) from rank_probs[head][rank] (the rest of
    the mass: a miss), deterministically."""
    import random

    cache: dict[tuple[int, int], int] = {}

    def rank_of(p: int, k: int) -> int:
        if (p, k) not in cache:
            u = random.Random(seed * 1_000_003 + p * 131 + k).random()
            r, acc = -1, 0.0
            for i, q in enumerate(rank_probs[k]):
                acc += q
                if u < acc:
                    r = i
                    break
            cache[(p, k)] = r
        return cache[(p, k)]

    return rank_of
