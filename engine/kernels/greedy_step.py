"""A greedy tree step's own work in a handful of launches: the heads' top-k, the draft, the target's
argmax at every node, verification with the next root and the compaction's slots, and the step trace.

Eagerly this work was 65 small torch kernels on a 64-node step (topk, cat, index, cumprod, argmax, ...).
At SmolLM2's size a step is launch-bound, so inside a CUDA graph each costs its launch and its tail
whatever its size (benchmarks/README.md, "SmolLM2-shape step"). Here it is:
  `draft`         2 launches  the heads' top-k (a pass over vocabulary chunks, then their merge), and
                              in the merge's program the node tokens and positions
  `greedy_accept` 2 launches  the target's argmax and log-sum-exp at every node (the same two
                              passes), and in the merge's program the accepted path, packed step,
                              next root and lengths (in place), the compaction's slots and the last
                              kept node's hidden state (what the next heads read)
  `trace_fields`  1 launch    the step trace (traced steps only: the untraced step runs no extra kernel)
The log-sum-exps (of the heads' rows and of the target's at every node) are read only by the trace, so
an untraced step skips them (`lse=False`): no exp or sum over any vocabulary chunk, no merge of the chunks'.
`row_topk` is the two passes alone (a sampled AR step's trace, a heads pass). A greedy AR step is
`greedy_accept` on a one-node tree (decode._ar_forward_fused). A merge and the work after it share a
program, one per request, so the step needs no launch to wait for the merge to finish.
The torch code these replace is their reference (`decode.tree_forward`'s unfused branch, and
`decode.trace_fields`); tests/test_greedy_step_gpu.py compares them on random inputs, and the engine's
greedy Medusa must still equal AR token for token under graphs.

Ties: `row_topk` ranks equal values by index (smallest first), as torch.argmax does for the top-1:
the target's argmax at every node is then the AR step's, so greedy Medusa == AR does not depend on
tie order. For the heads' top-k (bf16 logits tie often) the order decides which tied token is
drafted where, or at all when the tie is at the k-th place: speed, never the output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs use the references
    triton = None

from . import pdl

if triton is not None:
    from .pdl import wait_then_release

CHUNK = 2048  # vocabulary entries per program in row_topk's first pass
MERGE_ROWS = 4  # rows per program in row_topk's merge


@dataclass
class TopK:
    values: torch.Tensor  # [R, k] float32, largest first
    ids: torch.Tensor  # [R, k] int64
    lse: torch.Tensor | None  # [R] float32: log-sum-exp of the whole row (None: not asked for)


@dataclass
class Accepted:
    packed: torch.Tensor  # [B, 1 + 2W (+ trace width)]: kept, W accepted nodes, their W tokens, then the trace
    nodes: torch.Tensor  # [B, W] accepted path, root first, padded by repeating its last node (a view of packed)
    kept: torch.Tensor  # [B] (a view of packed)
    last_hidden: torch.Tensor | None  # [B, d] the last kept node's hidden state: the next heads read it (None: in a ring)
    src: torch.Tensor  # [B, W] cache slots of the accepted nodes ...
    dst: torch.Tensor  # [B, W] ... and where they move (KVCache.compact)
    target: TopK  # the target's argmax and log-sum-exp at every node (rows b * T + t)


@dataclass
class Drafted:
    top: TopK  # the heads' top-k (rows b * K + h)
    tokens: torch.Tensor  # [B, T] node tokens
    positions: torch.Tensor  # [B, T] start + depth


def row_topk_reference(x: torch.Tensor, k: int) -> TopK:
    xf = x.float().flatten(0, 1)
    values, ids = xf.topk(k, dim=-1)
    return TopK(values, ids, xf.logsumexp(-1))


if triton is not None:

    @triton.jit
    def _chunk_topk(X, Vals, Ids, Max, SumExp, V, n_chunks, inner, stride_outer, stride_inner,
                    K: tl.constexpr, BLOCK: tl.constexpr, LSE: tl.constexpr, PDL: tl.constexpr):
        """Program (row, chunk): the chunk's top-K (by repeated argmax, ties to the smaller index)
        and, with LSE, its max and sum of exp(x - max) for the row's log-sum-exp. Row r is
        X[r // inner, r % inner]. The first argmax is the chunk's max, so the loop does K reductions."""
        wait_then_release(PDL)
        row, c = tl.program_id(0), tl.program_id(1)
        offs = c * BLOCK + tl.arange(0, BLOCK)
        base = X + (row // inner).to(tl.int64) * stride_outer + (row % inner).to(tl.int64) * stride_inner
        x = tl.load(base + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        out = (row * n_chunks + c)
        top_i, j = tl.max(x, axis=0, return_indices=True)  # one reduction for the value and its index
        if LSE:
            tl.store(Max + out, top_i)
            # a chunk of only -inf (masked vocabulary) adds nothing (exp(x - top) would be exp(NaN) there)
            tl.store(SumExp + out, tl.sum(tl.exp(x - tl.where(top_i == float("-inf"), 0.0, top_i)), axis=0))
        for i in range(K):
            tl.store(Vals + out * K + i, top_i)
            tl.store(Ids + out * K + i, (c * BLOCK + j).to(tl.int64))
            if i + 1 < K:
                x = tl.where(tl.arange(0, BLOCK) == j, float("-inf"), x)
                top_i, j = tl.max(x, axis=0, return_indices=True)

    @triton.jit
    def _merge_rows(first, limit, Vals, Ids, Max, SumExp, OutVals, OutIds, Lse, n_chunks, K: tl.constexpr,
                    N_ROWS: tl.constexpr, ROWS: tl.constexpr, CAND: tl.constexpr, CHUNKS: tl.constexpr,
                    LSE: tl.constexpr):
        """Rows first .. first + N_ROWS - 1 that are below `limit`, ROWS at a time: each row's top-K
        among its chunks' candidates (chunks in index order, so the first of equal candidates has
        the smaller index) and, with LSE, its log-sum-exp over the chunks."""
        pos = tl.arange(0, CAND)[None, :]
        c = tl.arange(0, CHUNKS)[None, :]
        for r0 in range(0, N_ROWS, ROWS):
            row = first + r0 + tl.arange(0, ROWS)
            row_ok = row < limit
            ok = row_ok[:, None] & (pos < n_chunks * K)
            vals = tl.load(Vals + row[:, None] * n_chunks * K + pos, mask=ok, other=float("-inf"))
            ids = tl.load(Ids + row[:, None] * n_chunks * K + pos, mask=ok, other=0)
            for i in range(K):
                top_i, j = tl.max(vals, axis=1, return_indices=True)
                j = j[:, None]
                tl.store(OutVals + row * K + i, top_i, mask=row_ok)
                tl.store(OutIds + row * K + i, tl.sum(tl.where(pos == j, ids, 0), axis=1), mask=row_ok)
                vals = tl.where(pos == j, float("-inf"), vals)
            if LSE:
                live = row_ok[:, None] & (c < n_chunks)
                m = tl.load(Max + row[:, None] * n_chunks + c, mask=live, other=float("-inf"))
                s = tl.load(SumExp + row[:, None] * n_chunks + c, mask=live, other=0.0)
                top = tl.where(row_ok, tl.max(m, axis=1), 0.0)  # rows past the end would make -inf - -inf
                tl.store(Lse + row, top + tl.log(tl.sum(s * tl.exp(m - top[:, None]), axis=1)), mask=row_ok)

    @triton.jit
    def _merge_topk(Vals, Ids, Max, SumExp, OutVals, OutIds, Lse, n_rows, n_chunks,
                    K: tl.constexpr, ROWS: tl.constexpr, CAND: tl.constexpr, CHUNKS: tl.constexpr, PDL: tl.constexpr):
        """Program (block of ROWS rows): `_merge_rows`, log-sum-exp included."""
        wait_then_release(PDL)
        _merge_rows(tl.program_id(0) * ROWS, n_rows, Vals, Ids, Max, SumExp, OutVals, OutIds, Lse, n_chunks,
                    K, ROWS, ROWS, CAND, CHUNKS, True)

    @triton.jit
    def _merge_draft(Vals, Ids, Max, SumExp, OutVals, OutIds, Lse, Root, TreeIdx, PosIds, Start, Tokens, Positions,
                     n_chunks, heads, T, TOPK: tl.constexpr, ROWS: tl.constexpr, CAND: tl.constexpr,
                     CHUNKS: tl.constexpr, BLOCK_T: tl.constexpr, LSE: tl.constexpr, PDL: tl.constexpr):
        """Program (request): its heads' top-k (`_merge_rows`), then the draft: node t's token is the
        root (flat index 0) or entry f - 1 of the heads' flattened top-k [K * topk]; its position is
        the request's length plus its depth."""
        wait_then_release(PDL)
        b = tl.program_id(0)
        _merge_rows(b * heads, b * heads + heads, Vals, Ids, Max, SumExp, OutVals, OutIds, Lse, n_chunks, TOPK, ROWS, ROWS,
                    CAND, CHUNKS, LSE)
        tl.debug_barrier()  # the top-k ids stored above are read back, by other threads, below
        t = tl.arange(0, BLOCK_T)
        ok = t < T
        f = tl.load(TreeIdx + t, mask=ok, other=0)
        tok = tl.load(OutIds + b * heads * TOPK + tl.maximum(f - 1, 0), mask=ok & (f > 0), other=0)
        tok = tl.where(f == 0, tl.load(Root + b), tok)
        tl.store(Tokens + b * T + t, tok, mask=ok)
        tl.store(Positions + b * T + t, tl.load(Start + b) + tl.load(PosIds + t, mask=ok, other=0), mask=ok)

    @triton.jit
    def _merge_accept(Vals, Ids, Max, SumExp, TopVals, TopIds, Lse, Retrieve, Tokens, Lengths, Packed, Roots,
                      Hidden, LastHidden, Slot, Count, slot_stride, Src, Dst, n_chunks, T, P, W, packed_stride,
                      BLOCK_T: tl.constexpr, ROWS: tl.constexpr, CAND: tl.constexpr, CHUNKS: tl.constexpr,
                      BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_W: tl.constexpr, DIM: tl.constexpr,
                      BLOCK_HID: tl.constexpr, LSE: tl.constexpr, RING: tl.constexpr, PDL: tl.constexpr):
        """Program (request): the target's argmax (and, with LSE, log-sum-exp) at each of its T nodes
        (`_merge_rows`), then every root-to-leaf path's accepted length (nodes whose token is the
        target's argmax at their parent, from the root down), the first longest path, and what
        the step writes from it. Lengths holds each request's start and gets its new length: the
        program reads its own entry before it writes it. With RING the last kept hidden state goes
        to row b of slot `Slot` of a ring ([slots, cap, DIM] at LastHidden), and the program that
        finishes last (`Count`, back to 0 after) advances the slot, which every program read first."""
        wait_then_release(PDL)
        b = tl.program_id(0)
        _merge_rows(b * T, b * T + T, Vals, Ids, Max, SumExp, TopVals, TopIds, Lse, n_chunks, 1, BLOCK_T, ROWS, CAND,
                    CHUNKS, LSE)
        tl.debug_barrier()  # the argmaxes stored above are read back, by other threads, below
        p = tl.arange(0, BLOCK_P)[:, None]
        j = tl.arange(0, BLOCK_D)[None, :]
        inside = (p < P) & (j < W - 1)
        child = tl.load(Retrieve + p * W + j + 1, mask=inside, other=-1)  # node at depth j + 1
        parent = tl.load(Retrieve + p * W + j, mask=inside, other=0)  # the node whose argmax judges it
        present = child >= 0
        cand = tl.load(Tokens + b * T + child, mask=present, other=-1)
        want = tl.load(TopIds + b * T + parent, mask=present, other=-2)
        fail = tl.where(present & (cand == want), W - 1, j + 0 * p)  # first failing depth, else D
        length = tl.where(tl.arange(0, BLOCK_P) < P, tl.min(fail, axis=1), -1)
        best, row = tl.max(length, axis=0, return_indices=True)  # the first path of the greatest length
        w = tl.arange(0, BLOCK_W)
        wok = w < W
        node = tl.load(Retrieve + row * W + tl.minimum(w, best), mask=wok, other=0)
        kept = (best + 1).to(tl.int64)
        last = tl.load(Retrieve + row * W + best)
        start = tl.load(Lengths + b)
        out = Packed + b * packed_stride
        tl.store(out, kept)
        tl.store(out + 1 + w, node, mask=wok)
        tl.store(out + 1 + W + w, tl.load(Tokens + b * T + node, mask=wok, other=0), mask=wok)
        tl.store(Src + b * W + w, start + node, mask=wok)
        tl.store(Dst + b * W + w, start + tl.minimum(w, kept - 1), mask=wok)
        next_root = tl.load(TopIds + b * T + last)
        # every thread has read its request's start (Src, Dst above) before it is replaced, and its node tokens
        # before the root is: an AR step's one node is the root itself (decode._ar_forward_fused)
        tl.debug_barrier()
        tl.store(Lengths + b, start + kept)
        tl.store(Roots + b, next_root)
        src = Hidden + (b * T + last).to(tl.int64) * DIM
        dst = LastHidden + b * DIM
        if RING:
            slot = tl.load(Slot)
            dst += slot * slot_stride
        for c in range(0, DIM, BLOCK_HID):  # DIM, the hidden size, is a constant of the model
            h = c + tl.arange(0, BLOCK_HID)
            tl.store(dst + h, tl.load(src + h, mask=h < DIM), mask=h < DIM)
        if RING:
            tl.debug_barrier()  # every thread of the program has read the slot
            if tl.atomic_add(Count, 1) == tl.num_programs(0) - 1:  # acq_rel: every other program read it too
                tl.store(Count, 0)
                tl.store(Slot, slot + 1)

    @triton.jit
    def _micro(p):
        return tl.floor(p * 1000000.0 + 0.5).to(tl.int64)

    @triton.jit
    def _trace(Tokens, tok_stride, Parent, Logits, TopVals, TopIds, Lse, HeadVals, HeadIds, HeadLse, Out, out_stride, sb, st,
               T, KT, TOPK,
               BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr):
        """Program (request): the fields of decode.trace_fields under greedy acceptance."""
        wait_then_release(PDL)
        b = tl.program_id(0)
        out = Out + b * out_stride
        t = tl.arange(0, BLOCK_T)
        ok = t < T
        tok = tl.load(Tokens + b * tok_stride + t, mask=ok, other=0)
        par = tl.load(Parent + t, mask=ok, other=-1)
        pc = tl.maximum(par, 0)
        lse = tl.load(Lse + b * T + t, mask=ok, other=0.0)
        at_parent = tl.load(Logits + b.to(tl.int64) * sb + pc.to(tl.int64) * st + tok, mask=ok, other=0.0).to(tl.float32)
        p_parent = tl.exp(at_parent - tl.load(Lse + b * T + pc, mask=ok, other=0.0))
        keep = tl.where(tok == tl.load(TopIds + b * T + pc, mask=ok, other=-1), 1000000, 0).to(tl.int64)
        root = par < 0
        tl.store(out + t, tok, mask=ok)
        tl.store(out + T + t, tl.load(TopIds + b * T + t, mask=ok, other=0), mask=ok)
        tl.store(out + 2 * T + t, _micro(tl.exp(tl.load(TopVals + b * T + t, mask=ok, other=0.0) - lse)), mask=ok)
        tl.store(out + 3 * T + t, tl.where(root, -1, _micro(p_parent)), mask=ok)
        tl.store(out + 4 * T + t, tl.where(root, -1, keep), mask=ok)
        h = tl.arange(0, BLOCK_H)
        hok = h < KT
        tl.store(out + 5 * T + h, tl.load(HeadIds + b * KT + h, mask=hok, other=0), mask=hok)
        head_p = tl.exp(tl.load(HeadVals + b * KT + h, mask=hok, other=0.0)
                        - tl.load(HeadLse + b * (KT // TOPK) + h // TOPK, mask=hok, other=0.0))
        tl.store(out + 5 * T + KT + h, _micro(head_p), mask=hok)


def _pow2(n: int, least: int = 16) -> int:
    return max(least, triton.next_power_of_2(n))


@dataclass
class _Chunks:
    """row_topk's first pass: each (row, chunk)'s top-k, max and sum of exp(x - max)."""

    vals: torch.Tensor  # [R, n_chunks, k] float32
    ids: torch.Tensor  # [R, n_chunks, k] int64
    max: torch.Tensor  # [R, n_chunks] float32
    sum_exp: torch.Tensor  # [R, n_chunks] float32
    k: int

    @property
    def n_chunks(self) -> int:
        return self.max.shape[1]

    def args(self) -> tuple:
        return self.vals, self.ids, self.max, self.sum_exp

    def merge_sizes(self) -> dict:
        return dict(CAND=_pow2(self.n_chunks * self.k), CHUNKS=_pow2(self.n_chunks))


def _chunk_pass(x: torch.Tensor, k: int, lse: bool) -> _Chunks:
    """The first of row_topk's two launches over x [A, C, V] (V contiguous; A, C any strides); without
    `lse`, chunks.max and chunks.sum_exp are left unwritten."""
    outer, inner, vocab = x.shape
    if x.stride(2) != 1:
        raise ValueError("row_topk needs the last dim contiguous")
    rows = outer * inner
    block = min(CHUNK, _pow2(vocab))
    n_chunks = triton.cdiv(vocab, block)
    dev = x.device
    chunks = _Chunks(torch.empty(rows, n_chunks, k, device=dev, dtype=torch.float32),
                     torch.empty(rows, n_chunks, k, device=dev, dtype=torch.int64),
                     torch.empty(rows, n_chunks, device=dev, dtype=torch.float32),
                     torch.empty(rows, n_chunks, device=dev, dtype=torch.float32), k)
    _chunk_topk[(rows, n_chunks)](x, *chunks.args(), vocab, n_chunks, inner, x.stride(0), x.stride(1), K=k, BLOCK=block,
                                     LSE=lse, **pdl.options(x))
    return chunks


def _empty_topk(rows: int, k: int, device, lse: bool = True) -> TopK:
    return TopK(torch.empty(rows, k, device=device, dtype=torch.float32),
                torch.empty(rows, k, device=device, dtype=torch.int64),
                torch.empty(rows, device=device, dtype=torch.float32) if lse else None)


def _lse_arg(top: TopK, chunks: _Chunks) -> torch.Tensor:
    """The log-sum-exp's pointer for a merge kernel. When none is asked for, the kernel never touches it: the
    chunk pass's unwritten scratch (at least one float per row) stands in, so a stray store hits no output."""
    return top.lse if top.lse is not None else chunks.max


def row_topk(x: torch.Tensor, k: int) -> TopK:
    """`row_topk_reference` over the last dim of a CUDA tensor [A, C, V] (any float dtype; V
    contiguous, A and C any strides: the heads' logits are [B, K, V] transposed from [K, B, V]),
    rows in order a * C + c, in two launches. Rows must hold at least k finite values (a chunk of
    only -inf adds nothing to the log-sum-exp)."""
    chunks = _chunk_pass(x, k, lse=True)
    rows = chunks.max.shape[0]
    out = _empty_topk(rows, k, x.device)
    _merge_topk[(triton.cdiv(rows, MERGE_ROWS),)](*chunks.args(), out.values, out.ids, out.lse, rows, chunks.n_chunks,
                                                   K=k, ROWS=MERGE_ROWS, **chunks.merge_sizes(), **pdl.options(x))
    return out


def draft(head_logits: torch.Tensor, topk: int, root: torch.Tensor, tree_indices: torch.Tensor,
          position_ids: torch.Tensor, start: torch.Tensor, lse: bool = True) -> Drafted:
    """head_logits [B, K, V] (`row_topk`'s layouts), root [B], start [B] -> the heads' top-k (rows
    b * K + h) and the node tokens and positions [B, T] (decode.draft, and start + depth), in two
    launches: the top-k's first pass, then its merge and the draft in one program per request. The
    top-k's log-sum-exp only a trace reads: `lse=False` skips it (top.lse is then None)."""
    b, k, _ = head_logits.shape
    t = tree_indices.numel()
    chunks = _chunk_pass(head_logits, topk, lse)
    dev = root.device
    out = Drafted(_empty_topk(b * k, topk, dev, lse), torch.empty(b, t, device=dev, dtype=torch.int64),
                  torch.empty(b, t, device=dev, dtype=torch.int64))
    _merge_draft[(b,)](*chunks.args(), out.top.values, out.top.ids, _lse_arg(out.top, chunks), root, tree_indices, position_ids,
                       start, out.tokens, out.positions, chunks.n_chunks, k, t, TOPK=topk, ROWS=_pow2(k, 1),
                       BLOCK_T=_pow2(t), LSE=lse, **chunks.merge_sizes(), **pdl.options(root))
    return out


def greedy_accept(retrieve: torch.Tensor, tokens: torch.Tensor, logits: torch.Tensor, hidden: torch.Tensor,
                  lengths: torch.Tensor, root: torch.Tensor, trace_width: int = 0, lse: bool = True,
                  ring=None) -> Accepted:
    """retrieve [P, W] (root-to-leaf paths, -1 padded), node tokens [B, T], the target's logits and
    hidden states at every node [B, T, V] (`row_topk`'s layouts) and [B, T, d] (contiguous), each
    request's length before the step [B] -> the target's argmax and log-sum-exp per node, and what
    the step keeps (accept.RULES["greedy"].verify and tree_forward's bookkeeping), in two launches:
    the argmax's first pass, then its merge and the verification in one program per request.
    `lengths` and `root` [B] get the new lengths and next roots in place: a graph's static state then
    needs no copy of them (a launch each). `tokens` may be a view of `root` (an AR step's one node is its
    root): the merge reads them before it writes the next roots. `packed` gets trace_width more columns,
    left for `trace_fields` to fill. The log-sum-exp only a trace reads: `lse=False` skips it.
    `ring` (engine/head_trace.py's HiddenRing: `states` [slots, cap, d], `slot` [1] int64, `count` [1]
    int32 at 0) takes the last kept hidden states instead of a new tensor (`last_hidden` is then None):
    into its slot `slot`, which then advances, all in this launch. A traced AR step's graph keeps its
    hidden state for the heads so, with no launch of its own (the demo's step is a chain of launches)."""
    b, t = tokens.shape
    paths, w = retrieve.shape
    dim = hidden.shape[-1]
    if not all(x.is_contiguous() for x in (hidden, tokens, lengths, root)):
        raise ValueError("greedy_accept needs hidden, tokens, lengths and root contiguous (the kernel indexes them flat)")
    if ring is not None and (ring.states.shape[1] < b or ring.states.shape[2] != dim
                             or ring.states.dtype != hidden.dtype or not ring.states.is_contiguous()):
        raise ValueError(f"greedy_accept's ring {tuple(ring.states.shape)} {ring.states.dtype} does not hold {b} "
                         f"contiguous rows of {dim} {hidden.dtype}")
    dev = tokens.device
    chunks = _chunk_pass(logits, 1, lse)

    def new(*shape):
        return torch.empty(*shape, device=dev, dtype=torch.int64)

    packed = new(b, 1 + 2 * w + trace_width)
    last_hidden = torch.empty(b, dim, device=dev, dtype=hidden.dtype) if ring is None else None
    acc = Accepted(packed, packed[:, 1: 1 + w], packed[:, 0], last_hidden, new(b, w), new(b, w),
                   _empty_topk(b * t, 1, dev, lse))
    into, slot, count = (last_hidden, lengths, lengths) if ring is None else (ring.states, ring.slot, ring.count)
    _merge_accept[(b,)](*chunks.args(), acc.target.values, acc.target.ids, _lse_arg(acc.target, chunks), retrieve, tokens, lengths,
                        acc.packed, root, hidden, into, slot, count, into.stride(0), acc.src, acc.dst, chunks.n_chunks,
                        t, paths, w, acc.packed.stride(0), BLOCK_T=_pow2(t, 1), ROWS=min(64, _pow2(t, 1)),
                        BLOCK_P=_pow2(paths, 1), BLOCK_D=_pow2(w - 1, 1), BLOCK_W=_pow2(w, 1), DIM=dim,
                        BLOCK_HID=min(1024, _pow2(dim)), LSE=lse, RING=ring is not None, **chunks.merge_sizes(),
                        **pdl.options(hidden))
    return acc


def trace_fields(out: torch.Tensor, tokens: torch.Tensor, parent: torch.Tensor, logits: torch.Tensor, target: TopK,
                 heads: TopK | None, topk: int) -> None:
    """decode.trace_fields under greedy acceptance, written into out [B, decode.trace_width] (a column
    slice of the packed step: rows may be strided), from what the step already computed: the
    target's top-1 and log-sum-exp per node (`target`, rows b * T + t) and the heads' top-k that
    drafted the step (`heads`, rows b * K + h; None: no head fields). logits [B, T, V], V contiguous; `tokens` [B, T]
    with T contiguous, its rows may be strided (an AR step's root, read from its packed row)."""
    if target.lse is None or (heads is not None and heads.lse is None):
        raise ValueError("trace_fields needs the log-sum-exps: draft and greedy_accept with lse=True")
    if tokens.stride(1) != 1:
        raise ValueError("trace_fields needs each row of tokens contiguous (the kernel reads a row from its start)")
    b, t = tokens.shape
    kt = 0 if heads is None else heads.ids.numel() // b
    heads = heads or target  # never read when kt is 0
    _trace[(b,)](tokens, tokens.stride(0), parent, logits, target.values, target.ids, target.lse, heads.values, heads.ids, heads.lse,
                 out, out.stride(0), logits.stride(0), logits.stride(1), t, kt, topk, BLOCK_T=_pow2(t), BLOCK_H=_pow2(kt),
                 **pdl.options(out))
