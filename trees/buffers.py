"""Tensors the engine needs to verify a tree in one forward pass.

Worked example (docs/algorithm.md), tree [[0],[1],[0,0],[0,1],[1,0],[0,0,0]], topk 10:
node order root,(0),(1),(0,0),(0,1),(1,0),(0,0,0); tree_indices [0,1,2,11,12,11,21];
position_ids [0,1,1,2,2,2,3]; the mask row of (0,0,0) is [1,1,0,1,0,0,1].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .tree import validate


@dataclass(frozen=True)
class TreeBuffers:
    paths: list[tuple[int, ...]]  # non-root nodes in node order; node i+1 is paths[i]
    attn_mask: torch.Tensor  # [T, T] bool: ancestors and self
    tree_indices: torch.Tensor  # [T] long: node -> index into [root, head0 top-k, head1 top-k, ...]
    position_ids: torch.Tensor  # [T] long: depth of each node (root 0)
    retrieve_indices: torch.Tensor  # [P, D+1] long: root-to-leaf node paths, padded with -1
    parent: torch.Tensor  # [T] long: parent node, -1 for the root
    ranks: torch.Tensor  # [T] long: own rank, -1 for the root
    mask_bits: torch.Tensor  # [T, W] int64: attn_mask rows packed 64 nodes per word (kernels)
    topk: int

    @property
    def num_nodes(self) -> int:
        return self.attn_mask.shape[0]

    @property
    def depth(self) -> int:
        return self.retrieve_indices.shape[1] - 1

    def to(self, device: torch.device | str) -> TreeBuffers:
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return TreeBuffers(**moved)


def pack_mask_bits(mask: torch.Tensor) -> torch.Tensor:
    """Pack a [T, T] bool mask into [T, ceil(T/64)] int64 words, bit b of word w = column 64w+b."""
    t = mask.shape[0]
    words = (t + 63) // 64
    padded = torch.zeros(t, words * 64, dtype=torch.bool)
    padded[:, : mask.shape[1]] = mask
    bits = padded.view(t, words, 64).to(torch.int64)
    weights = torch.ones(64, dtype=torch.int64) << torch.arange(64, dtype=torch.int64)
    return (bits * weights).sum(-1)  # int64 wrap-around makes bit 63 the sign bit, as wanted


def buffers(choices: Sequence[Sequence[int]], topk: int = 10) -> TreeBuffers:
    """Build the verification buffers of a tree (validated first; node order is Medusa's)."""
    paths = validate(choices, topk=topk)
    t = len(paths) + 1
    index = {p: i + 1 for i, p in enumerate(paths)}
    index[()] = 0
    parent = torch.full((t,), -1, dtype=torch.long)
    ranks = torch.full((t,), -1, dtype=torch.long)
    tree_indices = torch.zeros(t, dtype=torch.long)
    position_ids = torch.zeros(t, dtype=torch.long)
    mask = torch.zeros(t, t, dtype=torch.bool)
    mask[0, 0] = True
    for p, i in ((p, index[p]) for p in paths):
        parent[i] = index[p[:-1]]
        ranks[i] = p[-1]
        tree_indices[i] = p[-1] + topk * (len(p) - 1) + 1
        position_ids[i] = len(p)
        mask[i] = mask[parent[i]]
        mask[i, i] = True
    has_child = {p[:-1] for p in paths}
    leaves = [p for p in paths if p not in has_child] or [()]
    max_depth = max((len(p) for p in paths), default=0)
    retrieve = torch.full((len(leaves), max_depth + 1), -1, dtype=torch.long)
    for row, leaf in enumerate(leaves):
        for d in range(len(leaf) + 1):
            retrieve[row, d] = index[leaf[:d]]
    return TreeBuffers(
        paths=paths,
        attn_mask=mask,
        tree_indices=tree_indices,
        position_ids=position_ids,
        retrieve_indices=retrieve,
        parent=parent,
        ranks=ranks,
        mask_bits=pack_mask_bits(mask),
        topk=topk,
    )
