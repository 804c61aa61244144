"""Decode steps over our Transformer: prefill, autoregressive steps and Medusa tree steps, batched.

Every step commits `[root] + accepted tree tokens` for each request and decides the next step's
root from the target's distribution at the last committed token, so AR and Medusa share one shape:
  AR:     root -> forward(root) -> next root
  Medusa: root + heads' top-k -> forward(tree) -> verify -> compact K/V -> next root
There is exactly one base-model forward per step for the whole batch (docs/algorithm.md). Requests
keep their own lengths in the static cache (a [B] device tensor plus its host mirror), accept their
own paths and compact their own K/V; a batch of one is the single-request case, not another path.

A step's device work (`ar_forward`, `tree_forward`) ends in one packed int64 tensor per request:
what it committed and, when traced, what the step trace records (computed on the device, so a
traced step is still one host transfer and can be captured in a CUDA graph). `finish_step` is the
host side that reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trees import TreeBuffers

from .accept import TYPICAL_DELTA, TYPICAL_EPSILON, typical_threshold, verify_greedy_batch, verify_typical
from .heads import MedusaHeads
from .model import Transformer
from .sampling import SamplingParams, sample, target_probs

MICRO = 1_000_000  # traced probabilities travel as integers in millionths (traces keep 6 decimals)


@dataclass
class DecodeState:
    lengths: torch.Tensor  # [B] long: cache slots holding each request's committed tokens
    host_lengths: list[int]  # the same on the host (bounds the attention span without a sync)
    root: torch.Tensor  # [B] long: each request's next token, already decided
    head_logits: torch.Tensor | None  # [B, K, V] the heads' view from the last committed token

    def copy_(self, other: DecodeState) -> None:
        """Take other's device tensors in place (a captured graph reads these addresses)."""
        self.lengths.copy_(other.lengths)
        self.root.copy_(other.root)
        if self.head_logits is not None:
            self.head_logits.copy_(other.head_logits)

    def clone(self) -> DecodeState:
        return DecodeState(self.lengths.clone(), list(self.host_lengths), self.root.clone(),
                           self.head_logits.clone() if self.head_logits is not None else None)

    def keep(self, rows: list[int]) -> None:
        """Keep only these requests (finished ones leave the batch)."""
        idx = torch.tensor(rows, device=self.root.device)
        self.lengths, self.root = self.lengths[idx], self.root[idx]
        self.host_lengths = [self.host_lengths[r] for r in rows]
        if self.head_logits is not None:
            self.head_logits = self.head_logits[idx]


@dataclass
class StepTrace:
    """What the step trace records of one request's step (docs/trace-schema.md), as host lists."""

    node_tokens: list[int]  # [T] candidates verified (AR: the one token fed)
    target_argmax: list[int]  # [T] the target's choice after each node
    target_argmax_prob: list[float]  # [T] its probability (temperature 1)
    target_prob: list[float | None]  # [T] probability the target gave each node's token at its parent
    accept_prob: list[float | None]  # [T] chance the run's acceptance rule keeps the node once its parent is kept
    head_topk: list[list[tuple[int, float]]]  # [K][topk] (token, prob) of each head this step drafted from


@dataclass
class StepResult:
    tokens: list[int]  # committed this step, root first
    accepted_nodes: list[int]  # tree nodes kept, root (0) first; [0] for an AR step
    trace: StepTrace | None = None


@dataclass
class StepTensors:
    """One step on the device: `packed` [B, 1 + 2W (+ trace)] is each request's kept count, its W
    accepted nodes (padded by repeating the last), their W tokens, then the trace fields
    (`trace_fields`) when traced; `nodes`, `heads`, `topk` say how to read them."""

    packed: torch.Tensor
    nodes: int  # T
    heads: int  # K (0: no head top-k traced)
    topk: int
    traced: bool


def choose_next(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None) -> torch.Tensor:
    """[B, V] -> [B] next tokens."""
    if params.greedy:
        return logits.argmax(-1)
    return sample(target_probs(logits, params), gen)


def _head_logits(heads: MedusaHeads | None, model: Transformer, hidden: torch.Tensor) -> torch.Tensor | None:
    """[B, d] -> [B, K, V]."""
    if heads is None:
        return None
    return heads(hidden, model.lm_head.weight).transpose(0, 1).float()


@torch.inference_mode()
def prefill(model: Transformer, heads: MedusaHeads | None, prompts: list[list[int]], params, gen) -> DecodeState:
    """All prompts in one forward, right-padded: a real token only attends to earlier real tokens of
    its own row, and pad slots are past the row's length, so later steps never see them."""
    dev = model.embed_tokens.weight.device
    lens = [len(p) for p in prompts]
    ids = torch.zeros(len(prompts), max(lens), dtype=torch.long, device=dev)
    for r, p in enumerate(prompts):
        ids[r, : len(p)] = torch.tensor(p, device=dev)
    hidden = model(ids, torch.arange(ids.shape[1], device=dev), start=0)
    lengths = torch.tensor(lens, device=dev)
    last = hidden[torch.arange(len(prompts), device=dev), lengths - 1]  # [B, d]
    logits = model.lm_head(last).float()
    return DecodeState(lengths, lens, choose_next(logits, params, gen), _head_logits(heads, model, last))


def _micro(p: torch.Tensor) -> torch.Tensor:
    return (p * MICRO).round().long()


def trace_fields(logits: torch.Tensor, node_tokens: torch.Tensor, parent: torch.Tensor,
                 head_logits: torch.Tensor | None, topk: int, accept: str = "greedy",
                 params: SamplingParams | None = None) -> torch.Tensor:
    """[B, 5T (+ 2 K topk)] int64: node tokens, target argmax, its probability (temperature 1), the
    probability of each node's token at its parent, the probability that the run's acceptance rule
    keeps the node once its parent is kept (greedy, typical: 0 or 1; sample: p(x) at the run's
    temperature, which under recursive rejection is also the chance the path reaches it; the root
    -1 in both), then each head's top-k ids and probabilities. Log-sum-exps, not softmaxes, except
    for the rule of a sampled run, so a greedy trace makes no [B, T, V] probability tensor."""
    b = torch.arange(logits.shape[0], device=logits.device)[:, None]
    lse = logits.logsumexp(-1)  # [B, T]
    top, argmax = logits.max(-1)
    par = parent.clamp(min=0)[None].expand(logits.shape[0], -1)
    at_parent = logits[b, par, node_tokens] - lse.gather(1, par)
    if accept == "greedy" or params is None or params.greedy:
        keep = (node_tokens == argmax.gather(1, par)).float()
    else:
        probs = target_probs(logits, params)  # [B, T, V]
        keep = probs[b, par, node_tokens]
        if accept == "typical":
            threshold = typical_threshold(probs, TYPICAL_EPSILON, TYPICAL_DELTA)  # [B, T]
            keep = (keep > threshold.gather(1, par)).float()
    none = torch.full_like(node_tokens, -1)
    is_root = parent[None] < 0
    parts = [node_tokens, argmax, _micro((top - lse).exp()), torch.where(is_root, none, _micro(at_parent.exp())),
             torch.where(is_root, none, _micro(keep))]
    if head_logits is not None:
        vals, ids = head_logits.topk(topk, dim=-1)
        probs = (vals - head_logits.logsumexp(-1, keepdim=True)).exp()
        parts += [ids.flatten(1), _micro(probs).flatten(1)]
    return torch.cat(parts, dim=1)


def ar_forward(model: Transformer, heads: MedusaHeads | None, state: DecodeState, params, gen,
               span: int | None = None, trace_topk: int = 0) -> StepTensors:
    """Device work of an AR step (no host sync): updates state's tensors, not host_lengths.
    trace_topk > 0 packs the step trace (with the heads' top-k when heads are given)."""
    root = state.root
    drafted_from = state.head_logits
    hidden = model(root[:, None], state.lengths[:, None], start=state.lengths,
                   span=span or max(state.host_lengths) + 1)[:, 0]
    logits = model.lm_head(hidden).float()  # [B, V]
    # the heads only run when asked for (traces of AR runs feed head statistics)
    state.head_logits = _head_logits(heads, model, hidden)
    state.lengths = state.lengths + 1
    state.root = choose_next(logits, params, gen)
    one = torch.ones_like(root)
    packed = torch.stack((one, torch.zeros_like(root), root), dim=1)
    k = drafted_from.shape[1] if drafted_from is not None else 0
    if trace_topk:
        parent = torch.full((1,), -1, dtype=torch.long, device=root.device)
        packed = torch.cat((packed, trace_fields(logits[:, None], root[:, None], parent, drafted_from, trace_topk,
                                                 "greedy" if params.greedy else "sample", params)), 1)
    return StepTensors(packed, 1, k if trace_topk else 0, trace_topk, bool(trace_topk))


def draft(state: DecodeState, buf: TreeBuffers) -> torch.Tensor:
    """[B, T] candidate tokens of every tree node: flat = [root, head0 top-k, head1 top-k, ...]."""
    top = state.head_logits.topk(buf.topk, dim=-1).indices  # [B, K, topk]
    flat = torch.cat((state.root[:, None], top.flatten(1)), dim=1)
    return flat[:, buf.tree_indices]


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


def _accept(buf: TreeBuffers, node_tokens, logits, accept: str, params: SamplingParams, gen):
    """-> nodes [B, D+1] (each row: the accepted path, padded by repeating its last node),
    kept [B] (path lengths incl. the root) and next roots [B]."""
    b = node_tokens.shape[0]
    dev = node_tokens.device
    if accept == "greedy" or (accept != "sample" and params.greedy):
        rows, lengths = verify_greedy_batch(buf.retrieve_indices, node_tokens, logits)
        paths = buf.retrieve_indices[rows]  # [B, D+1], -1 past each path's end
        steps = torch.arange(paths.shape[1], device=dev)
        nodes = paths.gather(1, torch.minimum(steps[None], lengths[:, None]))
        last = nodes[:, -1]
        return nodes, lengths + 1, logits[torch.arange(b, device=dev), last].argmax(-1)
    depth = buf.retrieve_indices.shape[1]
    nodes = torch.zeros(b, depth, dtype=torch.long, device=dev)
    kept, roots = [], []
    for r in range(b):
        if accept == "typical":
            row, length = verify_typical(buf.retrieve_indices, node_tokens[r], logits[r], params.temperature)
            path = buf.retrieve_indices[row, : length + 1]
            nxt = logits[r, path[-1]].argmax(-1)  # Medusa keeps the root greedy under typical acceptance
        elif accept == "sample":
            p, nxt = verify_sample(buf, node_tokens[r], target_probs(logits[r], params), gen)
            path = torch.tensor(p, device=dev)
        else:
            raise ValueError(f"unknown acceptance {accept!r}")
        nodes[r, : path.numel()] = path
        nodes[r, path.numel():] = path[-1]
        kept.append(path.numel())
        roots.append(nxt)
    return nodes, torch.tensor(kept, device=dev), torch.stack(roots)


def tree_forward(model: Transformer, heads: MedusaHeads, buf: TreeBuffers, state: DecodeState, accept: str,
                 params: SamplingParams, gen, span: int | None = None, trace: bool = False) -> StepTensors:
    """Device work of a tree step: draft, one forward over every node, verify, compact K/V, next
    heads. Greedy acceptance never syncs with the host (so it can be captured in a CUDA graph);
    typical and sample verify row by row. Updates state's tensors, not host_lengths."""
    start = state.lengths
    drafted_from = state.head_logits
    node_tokens = draft(state, buf)  # [B, T]
    positions = start[:, None] + buf.position_ids[None]
    hidden = model(node_tokens, positions, start=start, block_mask=buf.attn_mask, tree_bits=buf.mask_bits,
                   span=span or max(state.host_lengths) + buf.num_nodes)  # [B, T, d]
    logits = model.lm_head(hidden).float()  # [B, T, V]
    nodes, kept, next_root = _accept(buf, node_tokens, logits, accept, params, gen)
    # the accepted path's K/V move to the slots right after each request's prefix
    steps = torch.arange(nodes.shape[1], device=nodes.device)
    model.cache.compact(start[:, None] + nodes, start[:, None] + torch.minimum(steps[None], kept[:, None] - 1))
    rows = torch.arange(nodes.shape[0], device=nodes.device)
    last = nodes.gather(1, (kept - 1)[:, None])[:, 0]
    state.head_logits = _head_logits(heads, model, hidden[rows, last])
    state.lengths = start + kept
    state.root = next_root
    packed = torch.cat((kept[:, None], nodes, node_tokens.gather(1, nodes)), dim=1)
    if trace:
        packed = torch.cat((packed, trace_fields(logits, node_tokens, buf.parent, drafted_from, buf.topk, accept, params)),
                           dim=1)
    return StepTensors(packed, buf.num_nodes, drafted_from.shape[1] if trace else 0, buf.topk, trace)


def finish_step(state: DecodeState, st: StepTensors, rows: list[list[int]] | None = None) -> list[StepResult]:
    """Host side of a step: the one transfer (unless the caller already read the packed rows), the
    host lengths, and one StepResult per request."""
    rows = st.packed.tolist() if rows is None else rows
    out = []
    t, k, topk = st.nodes, st.heads, st.topk
    for r, row in enumerate(rows):
        kept = row[0]
        w = (len(row) - 1 - (5 * t + 2 * k * topk if st.traced else 0)) // 2
        state.host_lengths[r] += kept
        res = StepResult(row[1 + w : 1 + w + kept], row[1 : 1 + kept])
        if st.traced:
            f = row[1 + 2 * w :]
            ids, probs = f[5 * t : 5 * t + k * topk], f[5 * t + k * topk :]
            res.trace = StepTrace(
                node_tokens=f[:t], target_argmax=f[t : 2 * t],
                target_argmax_prob=[p / MICRO for p in f[2 * t : 3 * t]],
                target_prob=[None if p < 0 else p / MICRO for p in f[3 * t : 4 * t]],
                accept_prob=[None if p < 0 else p / MICRO for p in f[4 * t : 5 * t]],
                head_topk=[[(ids[h * topk + i], probs[h * topk + i] / MICRO) for i in range(topk)] for h in range(k)])
        out.append(res)
    return out


@torch.inference_mode()
def ar_step(model: Transformer, heads: MedusaHeads | None, state: DecodeState, params, gen,
            trace_topk: int = 0) -> list[StepResult]:
    return finish_step(state, ar_forward(model, heads, state, params, gen, trace_topk=trace_topk))


@torch.inference_mode()
def tree_step(model: Transformer, heads: MedusaHeads, buf: TreeBuffers, state: DecodeState, accept: str,
              params: SamplingParams, gen: torch.Generator | None, trace: bool = False) -> list[StepResult]:
    return finish_step(state, tree_forward(model, heads, buf, state, accept, params, gen, trace=trace))
