"""Decode loops over our Transformer: prefill, autoregressive steps and Medusa tree steps.

Every step commits `[root] + accepted tree tokens` and decides the next step's root from the
target's distribution at the last committed token, so AR and Medusa share one shape:
  AR:     root -> forward(root) -> next root
  Medusa: root + heads' top-k -> forward(tree) -> verify -> compact K/V -> next root
There is exactly one base-model forward per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trees import TreeBuffers

from .accept import verify_greedy, verify_typical
from .heads import MedusaHeads
from .model import Transformer
from .sampling import SamplingParams, sample, target_probs


@dataclass
class DecodeState:
    prefix_len: int  # slots of the KV cache that hold committed tokens
    root: torch.Tensor  # [] long: the next token, already decided
    head_logits: torch.Tensor | None  # [K, V] the heads' view from the last committed token


@dataclass
class StepResult:
    tokens: list[int]  # committed this step, root first
    accepted_nodes: list[int]  # tree nodes kept, root (0) first; [0] for an AR step
    node_tokens: torch.Tensor | None = None  # [T] candidates verified (Medusa only)
    node_logits: torch.Tensor | None = None  # [T, V] target logits at each node
    head_logits: torch.Tensor | None = None  # [K, V] heads' logits this step drafted from


def choose_next(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None) -> torch.Tensor:
    if params.greedy:
        return logits.argmax(-1)
    return sample(target_probs(logits, params), gen)


@torch.inference_mode()
def prefill(model: Transformer, heads: MedusaHeads | None, ids: torch.Tensor, params, gen) -> DecodeState:
    positions = torch.arange(ids.shape[0], device=ids.device)
    hidden = model(ids[None], positions, start=0, block_mask=None)[0, -1:]
    logits = model.lm_head(hidden)[0].float()
    head_logits = heads(hidden, model.lm_head.weight)[:, 0].float() if heads is not None else None
    return DecodeState(ids.shape[0], choose_next(logits, params, gen), head_logits)


@torch.inference_mode()
def ar_step(model: Transformer, heads: MedusaHeads | None, state: DecodeState, params, gen) -> StepResult:
    root = state.root
    pos = torch.tensor([state.prefix_len], device=root.device)
    hidden = model(root.view(1, 1), pos, start=state.prefix_len, block_mask=None)[0]
    logits = model.lm_head(hidden)[0].float()
    # the heads only run when asked for (traces of AR runs feed head statistics)
    state.head_logits = heads(hidden, model.lm_head.weight)[:, 0].float() if heads is not None else None
    state.prefix_len += 1
    state.root = choose_next(logits, params, gen)
    return StepResult([int(root)], [0], node_logits=logits[None])


def draft(state: DecodeState, buf: TreeBuffers) -> torch.Tensor:
    """Candidate tokens of every tree node: flat = [root, head0 top-k, head1 top-k, ...]."""
    top = state.head_logits.topk(buf.topk, dim=-1).indices  # [K, topk]
    flat = torch.cat((state.root.view(1), top.flatten()))
    return flat[buf.tree_indices]


def verify_sample(buf: TreeBuffers, node_tokens: torch.Tensor, probs: torch.Tensor, gen) -> tuple[list[int], torch.Tensor]:
    """Lossless recursive rejection over each node's children (SpecInfer/Sequoia style).

    At node u with target distribution p, try u's children in rank order: child c (token x) is
    accepted with probability r(x), where r starts as p and, after each rejection, loses the
    rejected token and is renormalised. If every child is rejected, the next token is drawn from r.
    Proof sketch: the candidates are fixed (not sampled), so this is the chain rule for drawing
    from p: P(x1) = p(x1); P(x2) = (1 - p(x1)) * p(x2) / (1 - p(x1)) = p(x2); and so on, the final
    residual draw covering the rest in proportion to p. Every committed token is therefore an
    exact draw from the target given the committed prefix, whatever the heads proposed.
    Returns the accepted node path (root first) and the next root token.
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


@torch.inference_mode()
def tree_step(
    model: Transformer,
    heads: MedusaHeads,
    buf: TreeBuffers,
    state: DecodeState,
    accept: str,
    params: SamplingParams,
    gen: torch.Generator | None,
) -> StepResult:
    start = state.prefix_len
    head_logits = state.head_logits
    node_tokens = draft(state, buf)
    positions = start + buf.position_ids
    hidden = model(node_tokens[None], positions, start=start, block_mask=buf.attn_mask)[0]  # [T, d]
    logits = model.lm_head(hidden).float()  # [T, V]
    if accept == "greedy" or (accept != "sample" and params.greedy):
        row, length = verify_greedy(buf.retrieve_indices, node_tokens, logits)
        nodes = buf.retrieve_indices[row, : length + 1]
        next_root = logits[nodes[-1]].argmax(-1)
    elif accept == "typical":
        row, length = verify_typical(buf.retrieve_indices, node_tokens, logits, params.temperature)
        nodes = buf.retrieve_indices[row, : length + 1]
        next_root = logits[nodes[-1]].argmax(-1)  # Medusa keeps the root greedy under typical acceptance
    elif accept == "sample":
        path, next_root = verify_sample(buf, node_tokens, target_probs(logits, params), gen)
        nodes = torch.tensor(path, device=node_tokens.device)
    else:
        raise ValueError(f"unknown acceptance {accept!r}")
    kept = nodes.numel()
    model.cache.compact(start + nodes, start + torch.arange(kept, device=nodes.device))
    last = nodes[-1:]
    state.head_logits = heads(hidden[last], model.lm_head.weight)[:, 0].float()
    state.prefix_len = start + kept
    state.root = next_root
    return StepResult(node_tokens[nodes].tolist(), nodes.tolist(), node_tokens, logits, head_logits)
