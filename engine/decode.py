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
host side that reads it into the step record, one `StepEvent` per request (engine/trace.py).
The acceptance rule (verification, next root, traced keep probability) comes from engine/accept.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trees import TreeBuffers

from .accept import RULES, Rule
from .heads import MedusaHeads
from .kernels import greedy_step
from .model import Transformer
from .sampling import SamplingParams, sample, target_probs
from .trace import MICRO, StepEvent


@dataclass
class DecodeState:
    lengths: torch.Tensor  # [B] long: cache slots holding each request's committed tokens
    host_lengths: list[int]  # the same on the host (bounds the attention span without a sync)
    root: torch.Tensor  # [B] long: each request's next token, already decided
    head_logits: torch.Tensor | None  # [B, K, V] the heads' view from the last committed token
    hidden: torch.Tensor | None = None  # [B, d] prefill's hidden state at each prompt's last token (steps leave it)

    def copy_(self, other: DecodeState) -> None:
        """Take other's device tensors in place (a captured graph reads these addresses); a tensor
        a step already wrote in place is not copied onto itself (in a graph, one launch less)."""
        for mine, theirs in ((self.lengths, other.lengths), (self.root, other.root),
                             (self.head_logits, other.head_logits)):
            if mine is not None and mine is not theirs:
                mine.copy_(theirs)

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
class StepTensors:
    """One step on the device: `packed` [B, 1 + 2W (+ trace)] is each request's kept count, its W
    accepted nodes (padded by repeating the last), their W tokens, then the trace fields
    (`trace_fields`) when traced; `nodes`, `heads`, `topk` say how to read them."""

    packed: torch.Tensor
    nodes: int  # T
    heads: int  # K (0: no head top-k traced)
    topk: int
    traced: bool
    hidden: torch.Tensor | None = None  # [B, d] an AR step's hidden state at its root (engine/head_trace.py)


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
    logits = model.logits(last).float()
    return DecodeState(lengths, lens, choose_next(logits, params, gen), _head_logits(heads, model, last), last)


def micro(p: torch.Tensor) -> torch.Tensor:
    """Probabilities as int64 millionths (how traces carry them)."""
    return (p * MICRO).round().long()


def trace_width(nodes: int, heads: int, topk: int) -> int:
    """Columns of a step trace (`trace_fields`): five per node, two per head candidate."""
    return 5 * nodes + 2 * heads * topk


def trace_fields(logits: torch.Tensor, node_tokens: torch.Tensor, parent: torch.Tensor,
                 head_logits: torch.Tensor | None, topk: int, rule: Rule = RULES["greedy"],
                 params: SamplingParams | None = None) -> torch.Tensor:
    """[B, 5T (+ 2 K topk)] int64: node tokens, target argmax, its probability (temperature 1), the
    probability of each node's token at its parent, the probability that the run's acceptance rule
    keeps the node once its parent is kept (`rule.keep_prob`: greedy and typical 0 or 1, sample p(x);
    the root -1), then each head's top-k ids and probabilities. Log-sum-exps, not softmaxes, except
    for the rule of a sampled run, so a greedy trace makes no [B, T, V] probability tensor."""
    b = torch.arange(logits.shape[0], device=logits.device)[:, None]
    lse = logits.logsumexp(-1)  # [B, T]
    top, argmax = logits.max(-1)
    par = parent.clamp(min=0)[None].expand(logits.shape[0], -1)
    at_parent = logits[b, par, node_tokens] - lse.gather(1, par)
    keep = rule.keep_prob(logits, argmax, node_tokens, par, params)
    none = torch.full_like(node_tokens, -1)
    is_root = parent[None] < 0
    parts = [node_tokens, argmax, micro((top - lse).exp()), torch.where(is_root, none, micro(at_parent.exp())),
             torch.where(is_root, none, micro(keep))]
    if head_logits is not None:
        parts += head_topk_fields(head_logits, topk)
    return torch.cat(parts, dim=1)


def head_topk_fields(head_logits: torch.Tensor, topk: int) -> list[torch.Tensor]:
    """[B, K, V] -> the trace's head fields: [B, K topk] token ids, then [B, K topk] probabilities in
    millionths (each head's softmax at temperature 1), largest first."""
    vals, ids = head_logits.topk(topk, dim=-1)
    probs = (vals - head_logits.logsumexp(-1, keepdim=True)).exp()
    return [ids.flatten(1), micro(probs).flatten(1)]


def ar_forward(model: Transformer, state: DecodeState, params, gen, span: int | None = None,
               trace_topk: int = 0, ring=None) -> StepTensors:
    """Device work of an AR step (no host sync): updates state's tensors, not host_lengths.
    trace_topk > 0 packs the target's step trace. The heads never run here: a traced run that records
    their top-k computes it from the returned hidden state, many steps at once (engine/head_trace.py);
    `ring` (a HiddenRing, on graphs) gets it in its next slot.
    A greedy step on the fused model is a one-node tree step's verification (`_ar_forward_fused`)."""
    root = state.root
    hidden = model(root[:, None], state.lengths[:, None], start=state.lengths,
                   span=span or max(state.host_lengths) + 1)  # [B, 1, d]
    if params.greedy and fused_greedy(model, RULES["greedy"], state):
        return _ar_forward_fused(model, state, hidden, trace_topk, ring)
    if ring is not None:
        ring.write(hidden[:, 0])
    logits = model.logits(hidden[:, 0]).float()  # [B, V]
    state.lengths = state.lengths + 1
    state.root = choose_next(logits, params, gen)
    one = torch.ones_like(root)
    packed = torch.stack((one, torch.zeros_like(root), root), dim=1)
    if trace_topk:
        packed = _ar_trace(model, packed, logits, root, trace_topk)
    return StepTensors(packed, 1, 0, trace_topk, bool(trace_topk), hidden[:, 0])


def _ar_trace(model: Transformer, packed: torch.Tensor, logits: torch.Tensor, root: torch.Tensor,
              topk: int) -> torch.Tensor:
    """A sampled (or unfused) AR step's packed [B, 3] with the target's trace appended (a one-node tree:
    the root). On the fused model the trace kernel writes it from one top-1 pass over the logits; the
    unfused model stays the torch reference."""
    parent = _one_node(root.device)[1]
    if not (model.fused and root.is_cuda and greedy_step.triton is not None):
        return torch.cat((packed, trace_fields(logits[:, None], root[:, None], parent, None, topk)), 1)
    out = torch.empty(packed.shape[0], 3 + trace_width(1, 0, topk), dtype=torch.long, device=root.device)
    out[:, :3] = packed
    greedy_step.trace_fields(out[:, 3:], root[:, None], parent, logits[:, None], greedy_step.row_topk(logits[:, None], 1),
                             None, topk)
    return out


_ONE_NODE: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _one_node(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A one-node tree's retrieve paths [[0]] and parents [-1] on `device`, made once (outside any graph:
    a captured step's warm-up runs eagerly first), so a captured AR step makes no tensor of its own."""
    if device not in _ONE_NODE:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("decode._one_node: first made inside a graph capture (run a step eagerly first)")
        _ONE_NODE[device] = (torch.zeros(1, 1, dtype=torch.long, device=device),
                             torch.full((1,), -1, dtype=torch.long, device=device))
    return _ONE_NODE[device]


def _ar_forward_fused(model: Transformer, state: DecodeState, hidden: torch.Tensor, trace_topk: int,
                      ring=None) -> StepTensors:
    """A greedy AR step's work after the forward as `greedy_step.greedy_accept` on a one-node tree (the
    root): the argmax over the logits in the model's dtype, the packed step [1, 0, root] and the new root
    and lengths in place, in two launches where the torch code (`ar_forward`'s other branch, its reference)
    is a float32 cast, an argmax, the length add and three kernels to pack. Traced, the trace kernel (one
    launch more) reads the argmax's log-sum-exp too; the ring's write is part of the second launch."""
    retrieve, parent = _one_node(hidden.device)
    logits = model.logits(hidden)  # [B, 1, V]
    width = trace_width(1, 0, trace_topk) if trace_topk else 0
    # the node tokens are the root, which the merge reads before it overwrites it with the next root
    acc = greedy_step.greedy_accept(retrieve, state.root[:, None], logits, hidden, state.lengths, state.root, width,
                                    lse=bool(trace_topk), ring=ring)
    if trace_topk:  # the trace reads the root where the merge packed it (column 2: [kept, node, token]), not a copy
        greedy_step.trace_fields(acc.packed[:, 3:], acc.packed[:, 2:3], parent, logits, acc.target, None, trace_topk)
    return StepTensors(acc.packed, 1, 0, trace_topk, bool(trace_topk), hidden[:, 0])


def draft(state: DecodeState, buf: TreeBuffers) -> torch.Tensor:
    """[B, T] candidate tokens of every tree node: flat = [root, head0 top-k, head1 top-k, ...]."""
    top = state.head_logits.topk(buf.topk, dim=-1).indices  # [B, K, topk]
    flat = torch.cat((state.root[:, None], top.flatten(1)), dim=1)
    return flat[:, buf.tree_indices]


def tree_forward(model: Transformer, heads: MedusaHeads, buf: TreeBuffers, state: DecodeState, rule: Rule,
                 params: SamplingParams, gen, span: int | None = None, trace: bool = False) -> StepTensors:
    """Device work of a tree step: draft, one forward over every node, verify, compact K/V, next
    heads. A rule with `graphs` (greedy) never syncs with the host, so the step can be captured in a
    CUDA graph; typical and sample verify row by row. Updates state's tensors, not host_lengths.
    On the fused model (CUDA graphs) a greedy step's own work runs in engine/kernels/greedy_step.py;
    the torch code here is its reference."""
    if fused_greedy(model, rule, state):
        return _tree_forward_fused(model, heads, buf, state, span, trace)
    start = state.lengths
    drafted_from = state.head_logits
    node_tokens = draft(state, buf)  # [B, T]
    positions = start[:, None] + buf.position_ids[None]
    hidden = model(node_tokens, positions, start=start, block_mask=buf.attn_mask, tree_bits=buf.mask_bits,
                   span=span or max(state.host_lengths) + buf.num_nodes)  # [B, T, d]
    logits = model.logits(hidden).float()  # [B, T, V]
    nodes, kept, next_root = rule.verify(buf, node_tokens, logits, params, gen)
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
        packed = torch.cat((packed, trace_fields(logits, node_tokens, buf.parent, drafted_from, buf.topk, rule, params)),
                           dim=1)
    return StepTensors(packed, buf.num_nodes, drafted_from.shape[1] if trace else 0, buf.topk, trace)


def fused_greedy(model: Transformer, rule: Rule, state: DecodeState) -> bool:
    """Whether a tree step runs greedy_step's kernels: greedy, on the fused model, on CUDA."""
    return rule.graphs and model.fused and state.root.is_cuda and greedy_step.triton is not None


def _tree_forward_fused(model: Transformer, heads: MedusaHeads, buf: TreeBuffers, state: DecodeState,
                        span: int | None, trace: bool) -> StepTensors:
    """tree_forward under greedy acceptance with the fused kernels: the same forward and heads, and
    five launches for the rest (six traced). The trace reuses the draft's top-k and the
    verification's per-node max and log-sum-exp, so tracing adds one kernel and no [B, T, V] pass."""
    start = state.lengths
    b, k, _ = state.head_logits.shape
    t = buf.num_nodes
    drafted = greedy_step.draft(state.head_logits, buf.topk, state.root, buf.tree_indices, buf.position_ids, start,
                                lse=trace)
    hidden = model(drafted.tokens, drafted.positions, start=start, block_mask=buf.attn_mask, tree_bits=buf.mask_bits,
                   span=span or max(state.host_lengths) + t)  # [B, T, d]
    logits = model.logits(hidden)  # [B, T, V] in the model's dtype: the kernels read it as it is
    width = trace_width(t, k, buf.topk) if trace else 0
    # in place: state.lengths (so `start` too) and state.root hold the next step's from here
    acc = greedy_step.greedy_accept(buf.retrieve_indices, drafted.tokens, logits, hidden, start, state.root, width,
                                    lse=trace)
    model.cache.compact(acc.src, acc.dst)
    # the next heads, in the model's dtype (the draft reads any; the values are those of _head_logits's cast):
    # into the state's own [K, B, V] buffer where it has one (StepGraphs' static state), which saves a graph
    # the copy of a new tensor into it, else a new tensor
    into = state.head_logits.transpose(0, 1)
    if into.is_contiguous() and into.dtype == hidden.dtype:
        heads(acc.last_hidden, model.lm_head.weight, out=into)
    else:
        state.head_logits = heads(acc.last_hidden, model.lm_head.weight).transpose(0, 1)
    if trace:
        w = acc.nodes.shape[1]
        greedy_step.trace_fields(acc.packed[:, 1 + 2 * w:], drafted.tokens, buf.parent, logits, acc.target, drafted.top,
                                 buf.topk)
    return StepTensors(acc.packed, t, k if trace else 0, buf.topk, trace)


def finish_step(state: DecodeState, st: StepTensors, rows: list[list[int]] | None = None) -> list[StepEvent]:
    """Host side of a step: the one transfer (unless the caller already read the packed rows), the
    host lengths, and one StepEvent per request (its tokens not yet cut at EOS or the limit)."""
    rows = st.packed.tolist() if rows is None else rows
    out = []
    t, k, topk = st.nodes, st.heads, st.topk
    for r, row in enumerate(rows):
        kept = row[0]
        w = (len(row) - 1 - (trace_width(t, k, topk) if st.traced else 0)) // 2
        state.host_lengths[r] += kept
        ev = StepEvent(row[1 + w : 1 + w + kept], row[1 : 1 + kept])
        if st.traced:  # the trace's fields from column o on, each sliced from the row (a 64-node row is some 400 long)
            o = 1 + 2 * w
            ev.node_tokens, ev.target_argmax = row[o: o + t], row[o + t: o + 2 * t]
            ev.target_argmax_prob = [p / MICRO for p in row[o + 2 * t: o + 3 * t]]
            ev.target_prob = [None if p < 0 else p / MICRO for p in row[o + 3 * t: o + 4 * t]]
            ev.accept_prob = [None if p < 0 else p / MICRO for p in row[o + 4 * t: o + 5 * t]]
            if k:
                ev.head_fields, ev.topk = row[o + 5 * t:], topk
        out.append(ev)
    return out


@torch.inference_mode()
def ar_step(model: Transformer, state: DecodeState, params, gen, trace_topk: int = 0) -> list[StepEvent]:
    return finish_step(state, ar_forward(model, state, params, gen, trace_topk=trace_topk))


@torch.inference_mode()
def tree_step(model: Transformer, heads: MedusaHeads, buf: TreeBuffers, state: DecodeState, rule: Rule,
              params: SamplingParams, gen: torch.Generator | None, trace: bool = False) -> list[StepEvent]:
    return finish_step(state, tree_forward(model, heads, buf, state, rule, params, gen, trace=trace))
