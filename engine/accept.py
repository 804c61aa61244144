"""Acceptance rules: which tree path to keep, given the target's logits at every node.

Each rule returns (row, length): the retrieve_indices row to keep and how many nodes beyond the
root it accepts. Rows are root-to-leaf node paths padded with -1.
"""

from __future__ import annotations

import torch

TYPICAL_EPSILON = 0.09
TYPICAL_DELTA = 0.3


def _paths(retrieve: torch.Tensor, node_tokens: torch.Tensor):
    safe = retrieve.clamp(min=0)
    cand = node_tokens[..., safe[:, 1:]]  # [..., P, D] token of the node at each depth
    parent = safe[:, :-1]  # [P, D] the node whose distribution judges it
    present = retrieve[:, 1:] >= 0
    return cand, parent, present


def verify_greedy_batch(retrieve: torch.Tensor, node_tokens: torch.Tensor, logits: torch.Tensor):
    """Per request, keep the longest path whose every node is the target's argmax at its parent
    (the first such path on ties). node_tokens [B, T], logits [B, T, V] -> rows [B], lengths [B].

    Under greedy decoding this reproduces plain autoregressive output exactly.
    """
    target = logits.argmax(-1)  # [B, T]
    cand, parent, present = _paths(retrieve, node_tokens)  # [B, P, D], [P, D], [P, D]
    ok = (cand == target[:, parent]) & present
    lengths = ok.long().cumprod(-1).sum(-1)  # [B, P]
    rows = lengths.argmax(-1)  # torch.argmax returns the first maximum
    return rows, lengths.gather(1, rows[:, None])[:, 0]


def verify_greedy(retrieve: torch.Tensor, node_tokens: torch.Tensor, logits: torch.Tensor) -> tuple[int, int]:
    """One request: node_tokens [T], logits [T, V] -> (row, length)."""
    rows, lengths = verify_greedy_batch(retrieve, node_tokens[None], logits[None])
    return int(rows[0]), int(lengths[0])


def typical_threshold(probs: torch.Tensor, epsilon: float, delta: float) -> torch.Tensor:
    """Medusa's typical acceptance bound min(epsilon, delta * exp(-H(p))) per row of probs."""
    entropy = -(probs * torch.log(probs.clamp_min(1e-30))).sum(-1)
    return torch.minimum(torch.full_like(entropy, epsilon), delta * torch.exp(-entropy))


def verify_typical(
    retrieve: torch.Tensor,
    node_tokens: torch.Tensor,
    logits: torch.Tensor,
    temperature: float,
    epsilon: float = TYPICAL_EPSILON,
    delta: float = TYPICAL_DELTA,
) -> tuple[int, int]:
    """Accept a candidate x at a node whose parent's distribution p has p(x) > min(eps, delta*e^-H).

    Not lossless. Among paths of the greatest accepted length, keep the most likely one (as Medusa).
    """
    probs = torch.softmax(logits.float() / max(temperature, 1e-5), dim=-1)
    threshold = typical_threshold(probs, epsilon, delta)
    cand, parent, present = _paths(retrieve, node_tokens)
    p_cand = probs[parent, cand]  # [P, D]
    ok = (p_cand > threshold[parent]) & present
    keep = ok.long().cumprod(1)
    lengths = keep.sum(1)
    best = int(lengths.max())
    if best == 0:
        return 0, 0
    loglik = (torch.log(p_cand.clamp_min(1e-30)) * keep).sum(1)
    loglik[lengths < best] = float("-inf")
    row = int(loglik.argmax())
    return row, best
