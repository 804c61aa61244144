"""How the tree-attention kernel's split policy was chosen (CUDA): `python benchmarks/attn_split_sweep.py`.

For each (SPLIT_FILL, MIN_SPLIT, row-tile cap) it times the kernel replayed from a CUDA graph (as
`bench --part attention` does) on T in {1, 16, 64} x L in {1024, 4096, 32768} x MHA / GQA 4:1, 32
query heads, D 128, bf16, and prints one JSON line per setting; the autotuner's cache is cleared
between settings so each is tuned for itself.
"""

from __future__ import annotations

import itertools
import json

import torch

import trees
from engine.bench.attention import graph_us
from engine.kernels import tree_attention as ta

SHAPES = [(hkv, t, L) for hkv in (32, 8) for t in (1, 16, 64) for L in (1024, 4096, 32768)]


def main() -> None:
    inputs = {}
    for hkv, t, L in SHAPES:
        tree = [list(p) for p in trees.kary(4, 3)][: t - 1]
        block = trees.buffers(tree).attn_mask if t > 1 else torch.ones(1, 1, dtype=torch.bool)
        q = torch.randn(1, 32, t, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, hkv, L + t, 128, device="cuda", dtype=torch.bfloat16)
        inputs[hkv, t, L] = (q, k, torch.randn_like(k), torch.tensor([L], device="cuda"),
                             trees.pack_mask_bits(block).cuda())
    for fill, min_split, cap in itertools.chain(itertools.product((1, 2, 4, 8), (128, 256, 512), (128,)),
                                                [(4, 256, 64), (2, 256, 64)]):
        ta.SPLIT_FILL, ta.MIN_SPLIT, ta.ROW_CAP = fill, min_split, cap
        ta._tree_attn_split.cache.clear()
        row = {"split_fill": fill, "min_split": min_split, "row_cap": cap}
        for (hkv, t, L), (q, k, v, start, bits) in inputs.items():
            row[f"{hkv}/{t}/{L}"] = round(graph_us(lambda: ta.tree_attention(q, k, v, start, tree_bits=bits)), 2)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
