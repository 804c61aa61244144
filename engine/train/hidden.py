"""The frozen base model's last hidden states, the heads' only input: recomputed per batch, or
computed once for the whole training set and gathered.

Medusa-1 never changes the base, so every epoch after the first recomputes the same hidden states. On
SmolLM2-135M a base forward is of the same order of FLOPs as the four heads' vocabulary projections
(about 0.2 GFLOP a position for the base's forward, 0.7 for the heads' forward and backward). With room for
[training tokens, d] in the training dtype (13 M tokens x 576 in bf16 is 15 GB, a fifth of an H100),
`HiddenStates` runs the base once over the data and each step then gathers its positions (its speed on
a GPU is not measured yet). Gathered states equal the per-batch ones up to the batch shape's rounding
(tested in fp32)."""

from __future__ import annotations

import numpy as np
import torch

from ..model import Transformer
from .data import Sequences, batches, make_batch

CACHE_SHARE = 0.5  # most of the free device memory the cache may take (the loss's logits need the rest)


def forward_hidden(base: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    """[B, L] tokens -> [B, L, d] last hidden states (right padding is harmless: attention is causal)."""
    with torch.no_grad():
        return base(tokens, torch.arange(tokens.shape[1], device=tokens.device), use_cache=False)


def cache_fits(base: Transformer, seqs: Sequences, max_len: int, device: torch.device) -> bool:
    """Whether the whole data set's hidden states fit in CACHE_SHARE of the device's free memory
    (on CPU: never cached by default, host memory is the user's to spend)."""
    if device.type != "cuda":
        return False
    need = int(np.minimum(seqs.lengths(), max_len).sum()) * base.args.dim * base.lm_head.weight.element_size()
    free, _ = torch.cuda.mem_get_info(device)
    return need < CACHE_SHARE * free


class HiddenStates:
    """The base's hidden states for batches of `seqs`: `get(idx, tokens, positions)` returns them at
    flat positions of the padded batch, from the cache when one was built, else by a forward."""

    def __init__(self, base: Transformer, seqs: Sequences, max_len: int, cache: bool, batch_tokens: int = 65536):
        self.base = base
        self.cache: torch.Tensor | None = None
        if not cache:
            return
        device = base.lm_head.weight.device
        kept = np.minimum(seqs.lengths(), max_len)  # make_batch keeps a sequence's first max_len tokens
        self.start = torch.from_numpy(np.concatenate(([0], np.cumsum(kept)[:-1]))).to(device)
        self.cache = torch.empty(int(kept.sum()), base.args.dim, dtype=base.lm_head.weight.dtype, device=device)
        for idx in batches(seqs, batch_tokens, np.random.default_rng(0)):
            x, lens, _ = make_batch(seqs, idx, max_len, device)
            t = torch.arange(x.shape[1], device=device)
            inside = t[None] < lens[:, None]
            rows = (self.start[torch.from_numpy(idx).to(device)][:, None] + t[None])[inside]
            self.cache[rows] = forward_hidden(base, x)[inside]

    def get(self, idx: np.ndarray, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Hidden states [N, d] at `positions`, flat indices into the [B, L] batch `tokens` of sequences `idx`."""
        if self.cache is None:
            return forward_hidden(self.base, tokens).flatten(0, 1)[positions]
        seq_len = tokens.shape[1]
        first = self.start[torch.from_numpy(np.asarray(idx)).to(positions.device)]
        return self.cache[first[positions // seq_len] + positions % seq_len]
