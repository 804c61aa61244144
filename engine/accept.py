"""Acceptance rules: which tree path a step keeps, given the target's logits at every node.

`RULES` has one entry per rule: its verify function, the probability its step traces record per
node, whether it samples, whether a CUDA graph can run it, and how the UI names it. A new rule is
one new entry; the config's check, the CLI's choices, the session, the graphs and the app read
them from here.

A verify function takes the tree buffers, the drafted node tokens [B, T], the target's logits at
every node [B, T, V], the sampling parameters and the generator, and returns
  nodes [B, D+1]  each request's accepted path, root first, padded by repeating its last node;
  kept  [B]       the path's length, the root included;
  roots [B]       each request's next root token.
Rows of `retrieve_indices` are root-to-leaf node paths padded with -1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from trees import TreeBuffers

from .sampling import SamplingParams, sample, target_probs

TYPICAL_EPSILON = 0.09
TYPICAL_DELTA = 0.3
ENTROPY_EPS = 1e-5  # Medusa's typical acceptance takes the entropy as -sum p log(p + 1e-5)


def _paths(retrieve: torch.Tensor, node_tokens: torch.Tensor):
    safe = retrieve.clamp(min=0)
    cand = node_tokens[..., safe[:, 1:]]  # [..., P, D] token of the node at each depth
    parent = safe[:, :-1]  # [P, D] the node whose distribution judges it
    present = retrieve[:, 1:] >= 0
    return cand, parent, present


# -- greedy -------------------------------------------------------------------------------------------
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


def _greedy(buf: TreeBuffers, node_tokens: torch.Tensor, logits: torch.Tensor, params: SamplingParams, gen):
    """On the device, with no host sync: a CUDA graph can replay it."""
    rows, lengths = verify_greedy_batch(buf.retrieve_indices, node_tokens, logits)
    paths = buf.retrieve_indices[rows]  # [B, D+1], -1 past each path's end
    steps = torch.arange(paths.shape[1], device=paths.device)
    nodes = paths.gather(1, torch.minimum(steps[None], lengths[:, None]))
    return nodes, lengths + 1, logits[torch.arange(nodes.shape[0], device=nodes.device), nodes[:, -1]].argmax(-1)


def _greedy_keep(logits, argmax, node_tokens, parent, params) -> torch.Tensor:
    return (node_tokens == argmax.gather(1, parent)).float()


# -- typical ------------------------------------------------------------------------------------------
def typical_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution typical acceptance judges by: softmax(logits / T), as in Medusa; top-k and
    top-p do not apply to it."""
    return torch.softmax(logits.float() / max(params.temperature, 1e-5), dim=-1)


def typical_threshold(probs: torch.Tensor, epsilon: float = TYPICAL_EPSILON, delta: float = TYPICAL_DELTA) -> torch.Tensor:
    """Medusa's bound min(epsilon, delta * exp(-H)) per row of probs, with the reference code's
    entropy H = -sum p log(p + 1e-5). That is not the textbook entropy: for a flat distribution over
    32k tokens its bound is 32 % higher (tests/test_accept.py works an example by hand)."""
    entropy = -(probs * torch.log(probs + ENTROPY_EPS)).sum(-1)
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
    One request: node_tokens [T], logits [T, V] -> (row, length).
    """
    probs = typical_probs(logits, SamplingParams(temperature))
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


def _row_by_row(buf: TreeBuffers, node_tokens: torch.Tensor, choose: Callable[[int], tuple[torch.Tensor, torch.Tensor]]):
    """Rules that decide on the host, one request at a time: choose(r) -> (its path [n], next root)."""
    b, dev = node_tokens.shape[0], node_tokens.device
    nodes = torch.zeros(b, buf.retrieve_indices.shape[1], dtype=torch.long, device=dev)
    kept, roots = [], []
    for r in range(b):
        path, root = choose(r)
        nodes[r, : path.numel()] = path
        nodes[r, path.numel():] = path[-1]
        kept.append(path.numel())
        roots.append(root)
    return nodes, torch.tensor(kept, device=dev), torch.stack(roots)


def _typical(buf: TreeBuffers, node_tokens: torch.Tensor, logits: torch.Tensor, params: SamplingParams, gen):
    def choose(r):
        row, length = verify_typical(buf.retrieve_indices, node_tokens[r], logits[r], params.temperature)
        path = buf.retrieve_indices[row, : length + 1]
        return path, logits[r, path[-1]].argmax(-1)  # the root stays greedy (Medusa)

    return _row_by_row(buf, node_tokens, choose)


def _typical_keep(logits, argmax, node_tokens, parent, params) -> torch.Tensor:
    probs = typical_probs(logits, params)  # [B, T, V]: the rule's own distribution, not the sampling one
    b = torch.arange(logits.shape[0], device=logits.device)[:, None]
    return (probs[b, parent, node_tokens] > typical_threshold(probs).gather(1, parent)).float()


# -- lossless sampling ----------------------------------------------------------------------------------
def verify_sample(buf: TreeBuffers, node_tokens: torch.Tensor, probs: torch.Tensor, gen) -> tuple[list[int], torch.Tensor]:
    """Lossless recursive rejection over each node's children (SpecInfer/Sequoia style).

    At node u with target distribution p, try u's children in rank order: child c (token x) is
    accepted with probability r(x), where r starts as p and, after each rejection, loses the
    rejected token and is renormalised. If every child is rejected, the next token is drawn from r.
    Proof sketch: the candidates are fixed (not sampled), so this is the chain rule for drawing
    from p: P(x1) = p(x1); P(x2) = (1 - p(x1)) * p(x2) / (1 - p(x1)) = p(x2); and so on, the final
    residual draw covering the rest in proportion to p. Every committed token is therefore an
    exact draw from the target given the committed prefix, whatever the heads proposed.
    One request: node_tokens [T], probs [T, V] -> the accepted node path (root first), next root.
    """
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(buf.parent.tolist()):
        if parent >= 0:
            children.setdefault(parent, []).append(node)
    tokens = node_tokens.tolist()
    path = [0]
    while True:
        u = path[-1]
        residual = probs[u].clone()
        nxt = None
        for c in children.get(u, []):
            x = tokens[c]
            px = float(residual[x])
            if px > 0 and float(torch.rand((), generator=gen, device=residual.device)) < px:
                nxt = c
                break
            residual[x] = 0.0
            total = residual.sum()
            if total <= 0:  # p put all its mass on rejected tokens: impossible for px < 1
                break
            residual = residual / total
        if nxt is None:
            return path, sample(residual, gen)
        path.append(nxt)


def _sample(buf: TreeBuffers, node_tokens: torch.Tensor, logits: torch.Tensor, params: SamplingParams, gen):
    def choose(r):
        path, root = verify_sample(buf, node_tokens[r], target_probs(logits[r], params), gen)
        return torch.tensor(path, device=node_tokens.device), root

    return _row_by_row(buf, node_tokens, choose)


def _sample_keep(logits, argmax, node_tokens, parent, params) -> torch.Tensor:
    """p(x) at the run's sampling distribution: under recursive rejection, also the chance that the
    step reaches the node once it reached its parent (the step-start estimator multiplies them)."""
    b = torch.arange(logits.shape[0], device=logits.device)[:, None]
    return target_probs(logits, params)[b, parent, node_tokens]


# -- the registry ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    name: str
    label: str  # how the app's choices and the CLI's help name it
    lossless: str  # what it preserves (the app's rule comparison says it)
    verify: Callable  # (buf, node_tokens, logits, params, gen) -> (nodes, kept, roots): see the module docstring
    # (logits [B, T, V], argmax [B, T], node_tokens [B, T], parent [B, T]) -> [B, T]: the chance the rule
    # keeps each node once its parent is kept (the trace's accept_prob)
    keep_prob: Callable
    samples: bool  # draws tokens from the target, the first one included (so a run needs a generator)
    graphs: bool  # decides on the device alone, so a CUDA graph can replay its steps


RULES: dict[str, Rule] = {r.name: r for r in (
    Rule("greedy", "greedy (lossless)", "yes, for greedy decoding (T = 0) only", _greedy, _greedy_keep,
         samples=False, graphs=True),
    Rule("typical", "typical (Medusa's, lossy)", "no", _typical, _typical_keep, samples=False, graphs=False),
    Rule("sample", "sample (lossless tree sampling)", "yes, at any temperature", _sample, _sample_keep,
         samples=True, graphs=False),
)}
