"""The greedy tree step's fused kernels (engine/kernels/greedy_step.py) against their torch
references on random inputs: the heads' top-k and the target's argmax with their log-sum-exps, the
draft, verification (a path accepted to its leaf, a path through non-first children, nothing
accepted) with the compaction's slots, and the step trace. GPU only, or on the CPU under Triton's
interpreter (`TRITON_INTERPRET=1` with triton installed), which is how they are debugged without one."""

import functools
import os
import zlib

import pytest
import torch
from conftest import DTYPE_IDS, QUICK
from test_kernels_gpu import random_tree

import trees
from engine import decode
from engine.accept import RULES
from engine.head_trace import HiddenRing
from engine.kernels import greedy_step as gs
from engine.sampling import SamplingParams

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1" and gs.triton is not None
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (torch.cuda.is_available() or INTERPRETED),
                                                  reason="needs CUDA (or TRITON_INTERPRET=1 with triton)")]


def dtype_id(value):
    return DTYPE_IDS.get(value) if isinstance(value, torch.dtype) else None


def gen_of(*case) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))


@pytest.mark.parametrize("outer, inner, vocab, dtype, k", [
    pytest.param(1, 4, 49152, BF16, 10, marks=QUICK),  # SmolLM2's heads (ties are common in bf16)
    pytest.param(3, 5, 32000, F32, 10),
    pytest.param(2, 64, 97, F32, 1, marks=QUICK),  # a tree's target argmax, one chunk
    pytest.param(1, 3, 128256 + 5, BF16, 1),  # a last chunk of 5 entries
    pytest.param(2, 3, 4096 + 3, F16, 7),  # a last chunk shorter than k
], ids=dtype_id)
def test_row_topk_matches_reference(outer, inner, vocab, dtype, k):
    """Values exactly, ids where values are untied (ties go to the smaller index), the log-sum-exp
    to float32 rounding; rows read through strides, as the heads' [B, K, V] logits are."""
    g = gen_of("topk", outer, inner, vocab, dtype, k)
    x = (torch.randn(inner, outer, vocab, generator=g) * 4).to(dtype).to(DEV).transpose(0, 1)
    got, want = gs.row_topk(x, k), gs.row_topk_reference(x, k)
    flat = x.float().flatten(0, 1)
    assert torch.equal(got.values, want.values)
    assert torch.equal(flat.gather(1, got.ids), got.values)
    assert all(len(set(r)) == k for r in got.ids.tolist())
    if dtype == F32:
        assert torch.equal(got.ids, want.ids)
    if k == 1:  # the target's argmax: the first maximum, as torch.argmax (greedy Medusa == AR rests on it)
        assert torch.equal(got.ids[:, 0], flat.argmax(-1))
    torch.testing.assert_close(got.lse, want.lse, rtol=1e-5, atol=1e-5)
    assert_chunks_skip_only_the_lse(x, k)


def assert_chunks_skip_only_the_lse(x, k):
    """The first pass without the log-sum-exp (an untraced step's) picks every chunk's top-k as with it."""
    on, off = gs._chunk_pass(x, k, lse=True), gs._chunk_pass(x, k, lse=False)
    assert torch.equal(off.vals, on.vals) and torch.equal(off.ids, on.ids)


def test_a_heads_pass_takes_the_fields_of_the_reference(monkeypatch):
    """engine/head_trace.py's fused fields ([rows, K, V] bf16 logits as the heads give them ->
    ids, then millionths) against decode.head_topk_fields in float32: ids where untied, the same
    probability for every candidate, and the candidates head by head in the same order."""
    from engine import head_trace

    monkeypatch.setattr(head_trace, "fused", lambda x: True)  # on the interpreter too
    g = gen_of("head pass")
    logits = (torch.randn(4, 37, 5000, generator=g) * 4).to(BF16).to(DEV).transpose(0, 1)  # [rows, K, V]
    got = head_trace.topk_fields(logits, 10)
    want = torch.cat(decode.head_topk_fields(logits.float(), 10), dim=1)
    assert got.shape == want.shape == (37, 2 * 4 * 10)
    ids, probs = got[:, :40].view(37, 4, 10), got[:, 40:].view(37, 4, 10)
    assert torch.equal(logits.float().gather(2, ids), logits.float().gather(2, want[:, :40].view(37, 4, 10)))
    assert (probs - want[:, 40:].view(37, 4, 10)).abs().max() <= micro_tolerance(logits.float())


def micro_tolerance(*logits) -> float:
    """How far two float32 computations of exp(x - logsumexp) may differ, in millionths: their
    rounding (1) plus a few float32 ulps of the largest |logit| (an error in x - lse is a relative
    error in p). At |logit| 50 that is 26: a wrong row, parent or log-sum-exp is off by thousands."""
    biggest = max(float(x.abs().max()) for x in logits if x is not None)
    return 2 + 1e6 * 8 * 2.0 ** -24 * 2 * biggest


def _step_inputs(n: int, batch: int, vocab: int, case, tree: list[list[int]] | None = None):
    g = gen_of(*case)
    buf = trees.buffers(tree or random_tree(n, zlib.crc32(repr(case).encode())), topk=10).to(DEV)
    heads = buf.retrieve_indices.shape[1] + 1
    head_logits = torch.randn(batch, heads, vocab, generator=g).to(DEV)
    root = torch.randint(0, vocab, (batch,), generator=g).to(DEV)
    start = torch.tensor([0, 17, 300, 5][:batch]).to(DEV)
    return g, buf, head_logits, root, start


@pytest.mark.parametrize("n", [pytest.param(1, marks=QUICK), 12, pytest.param(63, marks=QUICK), 255])
def test_draft_matches_reference(n):
    """Node tokens and positions, and the heads' top-k the draft's merge wrote (as row_topk's)."""
    _, buf, head_logits, root, start = _step_inputs(n, 3, 5000, ("draft", n))
    got = gs.draft(head_logits, buf.topk, root, buf.tree_indices, buf.position_ids, start)
    state = decode.DecodeState(start, start.tolist(), root, head_logits)
    assert torch.equal(got.tokens, decode.draft(state, buf))
    assert torch.equal(got.positions, start[:, None] + buf.position_ids[None])
    want = gs.row_topk_reference(head_logits, buf.topk)
    assert torch.equal(got.top.values, want.values) and torch.equal(got.top.ids, want.ids)
    torch.testing.assert_close(got.top.lse, want.lse, rtol=1e-5, atol=1e-5)
    # an untraced step's draft skips the log-sum-exp and changes nothing else
    bare = gs.draft(head_logits, buf.topk, root, buf.tree_indices, buf.position_ids, start, lse=False)
    assert bare.top.lse is None
    assert all(torch.equal(a, b) for a, b in ((bare.tokens, got.tokens), (bare.positions, got.positions),
                                              (bare.top.values, got.top.values), (bare.top.ids, got.top.ids)))


def _targets_along_paths(buf, tokens, g, plan):
    """Target argmaxes that accept, for request r with plan[r] = (retrieve row, depth), that many
    nodes down that root-to-leaf path; random elsewhere, never a node's token."""
    b, t = tokens.shape
    target = torch.randint(0, 1000, (b, t), generator=g).to(tokens.device) + 10_000
    for r, (row, depth) in enumerate(plan):
        path = [int(x) for x in buf.retrieve_indices[row].cpu() if x >= 0]
        for j in range(min(depth, len(path) - 1)):
            target[r, path[j]] = tokens[r, path[j + 1]]
    return target


DEEP = [[0] * d for d in range(1, 41)] + [[1], [0, 1]]  # a 40-deep chain: its path's slots span two warps and more


@pytest.mark.parametrize("n", [pytest.param(12, marks=QUICK), 63, pytest.param(255, marks=QUICK), "deep"])
def test_greedy_accept_matches_reference(n):
    """Kept path, packed step, next root and lengths (written in place), the last kept node's hidden
    state and the compaction's slots equal tree_forward's torch code (verify, then its bookkeeping).
    Request 0 accepts the last path to its leaf (through non-first children), 1 nothing, 2 the first
    path part way, 3 a random path to its leaf; on the deep tree request 0 accepts its 40-deep chain."""
    g, buf, head_logits, root, start = _step_inputs(n, 4, 50, ("accept", n), DEEP if n == "deep" else None)
    tokens = decode.draft(decode.DecodeState(start, start.tolist(), root, head_logits), buf)
    paths = buf.retrieve_indices.shape[0]
    first = int((buf.retrieve_indices >= 0).sum(1).argmax()) if n == "deep" else paths - 1
    plan = [(first, 99), (0, 0), (0, 2), (int(torch.randint(0, paths, (1,), generator=g)), 99)]
    target = _targets_along_paths(buf, tokens, g, plan)
    logits = torch.randn(*target.shape, 10_000 + 1000, generator=g).to(DEV).scatter_(2, target[..., None], 50.0)
    nodes, kept, next_root = RULES["greedy"].verify(buf, tokens, logits, SamplingParams(), None)
    hidden = torch.randn(*tokens.shape, 1500, generator=g).to(BF16).to(DEV)  # wider than one block of its copy
    lengths, next_root_in_place = start.clone(), root.clone()
    acc = gs.greedy_accept(buf.retrieve_indices, tokens, logits, hidden, lengths, next_root_in_place)
    assert torch.equal(acc.target.ids[:, 0], target.flatten())
    torch.testing.assert_close(acc.target.lse, logits.flatten(0, 1).logsumexp(-1), rtol=1e-5, atol=1e-5)
    steps = torch.arange(nodes.shape[1], device=DEV)
    assert torch.equal(acc.nodes, nodes) and torch.equal(acc.kept, kept) and torch.equal(next_root_in_place, next_root)
    assert torch.equal(acc.packed, torch.cat((kept[:, None], nodes, tokens.gather(1, nodes)), 1))
    assert torch.equal(lengths, start + kept)
    assert torch.equal(acc.src, start[:, None] + nodes)
    assert torch.equal(acc.dst, start[:, None] + torch.minimum(steps[None], kept[:, None] - 1))
    last = nodes.gather(1, (kept - 1)[:, None])[:, 0]
    assert torch.equal(acc.last_hidden, hidden[torch.arange(4, device=DEV), last])
    # the cases happened: nothing accepted; request 0's path whole (the deep chain, else through a child of rank > 0)
    assert kept[1] == 1 and kept[0] == int((buf.retrieve_indices[first] >= 0).sum())
    if n == "deep":
        assert kept[0] == 41
    else:
        ranks = (buf.tree_indices - 1) % buf.topk
        assert (ranks[nodes[0, 1: int(kept[0])]] > 0).any()
    # an untraced step skips the log-sum-exp and changes nothing else
    bare_lengths, bare_root = start.clone(), root.clone()
    bare = gs.greedy_accept(buf.retrieve_indices, tokens, logits, hidden, bare_lengths, bare_root, lse=False)
    assert bare.target.lse is None
    assert all(torch.equal(a, b) for a, b in (
        (bare.packed, acc.packed), (bare.src, acc.src), (bare.dst, acc.dst), (bare.last_hidden, acc.last_hidden),
        (bare.target.ids, acc.target.ids), (bare.target.values, acc.target.values), (bare_lengths, lengths),
        (bare_root, next_root_in_place)))


@functools.cache
def demo_engine():
    import engine

    return engine.load("demo", device=DEV, dtype="float32", backend="sdpa", cuda_graphs=False)


def demo_steps(step, heads: bool) -> list[torch.Tensor]:
    """Four steps of three requests on the demo model in float32 (eager, sdpa), `step(model, heads, state)` each
    (the demo's heads prefilled when `heads`), -> each step's packed tensor. Each call starts from a new cache and
    prefill, so the fused and torch runs a test compares start alike."""
    eng = demo_engine()
    model = eng.model
    prompts = [eng.tokenizer.encode(p) for p in ("def read_config(path):", "import os", "class Stack:\n    def push")]
    model.setup_cache(len(prompts), 256)
    with torch.inference_mode():
        state = decode.prefill(model, eng.heads if heads else None, prompts, SamplingParams(), None)
        steps = []
        for _ in range(4):
            steps.append(step(model, eng.heads, state).packed.clone())
            state.host_lengths = state.lengths.tolist()
    return steps


@QUICK
def test_fused_tree_steps_equal_the_torch_steps_on_the_demo():
    """decode._tree_forward_fused, what a graphed greedy step runs, against tree_forward's torch code: four steps
    of three requests on the demo model in float32, untraced (the log-sum-exps skipped) and traced. The packed
    steps are equal; the trace's probabilities agree to float32 rounding (in millionths)."""
    buf = trees.buffers([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [2], [0, 2]], topk=10).to(DEV)

    def run(fused: bool, trace: bool) -> list[torch.Tensor]:
        if fused:
            return demo_steps(lambda model, heads, state: decode._tree_forward_fused(model, heads, buf, state, None, trace),
                              heads=True)
        return demo_steps(lambda model, heads, state: decode.tree_forward(model, heads, buf, state, RULES["greedy"],
                                                                          SamplingParams(), None, trace=trace), heads=True)

    core = 1 + 2 * buf.retrieve_indices.shape[1]  # kept, the accepted nodes, their tokens
    for got, want in zip(run(True, False), run(False, False)):
        assert got.shape[1] == core and torch.equal(got, want)
    kept = []
    for got, want in zip(run(True, True), run(False, True)):
        assert torch.equal(got[:, :core], want[:, :core])
        assert torch.equal(got[:, core: core + 2 * buf.num_nodes], want[:, core: core + 2 * buf.num_nodes])  # ids
        assert (got[:, core:] - want[:, core:]).abs().max() <= 30  # micro_tolerance at |logit| <= 50
        kept += got[:, 0].tolist()
    assert max(kept) > 1  # the case happened: steps that accepted drafted nodes


@QUICK
def test_traced_fused_ar_steps_equal_the_torch_steps_on_the_demo():
    """decode._ar_forward_fused traced, what a graphed traced AR step runs, against ar_forward's torch code: four
    steps of three requests on the demo model in float32. Its trace kernel reads each request's root from the row
    the verification packed (a view with the packed width as its row stride), so three requests, not one, are what
    shows a stride read wrong. Packed steps equal; probabilities to float32 rounding (in millionths)."""
    def fused(model, heads, state):
        hidden = model(state.root[:, None], state.lengths[:, None], start=state.lengths, span=max(state.host_lengths) + 1)
        return decode._ar_forward_fused(model, state, hidden, 10)

    def torch_step(model, heads, state):
        return decode.ar_forward(model, state, SamplingParams(), None, trace_topk=10)

    roots = []
    for got, want in zip(demo_steps(fused, heads=False), demo_steps(torch_step, heads=False)):
        assert got.shape == want.shape == (3, 3 + decode.trace_width(1, 0, 10))
        assert torch.equal(got[:, :5], want[:, :5])  # kept, node, token; the trace's node token and target argmax
        assert (got - want).abs().max() <= 30  # micro_tolerance at |logit| <= 50
        roots.append(got[:, 2])
    assert len({tuple(r.tolist()) for r in roots}) == len(roots) and len(set(roots[0].tolist())) == 3  # rows differ


@QUICK
@pytest.mark.parametrize("lse", [True, False], ids=["traced", "untraced"])
def test_an_ar_step_is_greedy_accept_on_a_one_node_tree(lse):
    """decode._ar_forward_fused: the node tokens are a view of the roots the merge overwrites; it must read them
    first. Packed [1, 0, old root], next root the argmax of the logits in their own dtype (ties to the first, as
    torch.argmax on their float32 cast), lengths + 1, the hidden state and a compaction that moves nothing; with
    the log-sum-exp (a traced step) and without (an untraced one)."""
    g = gen_of("ar step")
    logits = (torch.randn(5, 1, 32000, generator=g) * 3).to(BF16)
    logits[1, 0, [7, 31000]] = 40.0  # a tie across chunks: the first wins
    logits = logits.to(DEV)
    root = torch.randint(0, 32000, (5,), generator=g).to(DEV)
    old_root, start = root.clone(), torch.randint(3, 900, (5,), generator=g).to(DEV)
    lengths = start.clone()
    hidden = torch.randn(5, 1, 64, generator=g).to(BF16).to(DEV)
    acc = gs.greedy_accept(torch.zeros(1, 1, dtype=torch.long, device=DEV), root[:, None], logits, hidden, lengths, root,
                           lse=lse)
    assert (acc.target.lse is not None) == lse
    ones, zeros = torch.ones_like(start), torch.zeros_like(start)
    assert torch.equal(acc.packed, torch.stack((ones, zeros, old_root), 1))
    assert torch.equal(root, logits[:, 0].float().argmax(-1)) and int(root[1]) == 7
    assert torch.equal(lengths, start + 1)
    assert torch.equal(acc.src, start[:, None]) and torch.equal(acc.dst, start[:, None])
    assert torch.equal(acc.last_hidden, hidden[:, 0])


@QUICK
def test_a_traced_ar_steps_verification_writes_the_ring_and_advances_its_slot():
    """A traced AR run's ring on the fused model (engine/head_trace.py, HiddenRing): greedy_accept puts each
    request's hidden state into the ring's slot and advances the slot, its count of finished programs back at 0,
    so the step's graph needs no launch of its own for it. Rows past the batch and the other slots stay as they
    were. Five AR steps into a ring of 6 slots x 4 rows from slot 1, the batch going from 3 requests to 2 after the
    third (requests leave); then a ring too small and one of another dtype, refused."""
    g = gen_of("ring")
    ring = HiddenRing(torch.randn(6, 4, 96, generator=g).to(F16).to(DEV), torch.ones(1, dtype=torch.long, device=DEV),
                      torch.zeros(1, dtype=torch.int32, device=DEV))
    want = ring.states.clone()
    one_node = torch.zeros(1, 1, dtype=torch.long, device=DEV)
    lengths = torch.randint(3, 900, (3,), generator=g).to(DEV)
    root = torch.randint(0, 500, (3,), generator=g).to(DEV)
    for step in range(5):
        if step == 3:
            lengths, root = lengths[:2].clone(), root[:2].clone()
        b = root.shape[0]
        logits = torch.randn(b, 1, 500, generator=g).to(F16).to(DEV)
        hidden = torch.randn(b, 1, 96, generator=g).to(F16).to(DEV)
        acc = gs.greedy_accept(one_node, root[:, None], logits, hidden, lengths, root, ring=ring)
        want[1 + step, :b] = hidden[:, 0]
        assert acc.last_hidden is None
        assert int(ring.slot) == 2 + step and int(ring.count) == 0
        assert torch.equal(root, logits[:, 0].float().argmax(-1))
    assert torch.equal(ring.states, want)
    for bad in (ring.states[:, :1].contiguous(), ring.states.float()):
        with pytest.raises(ValueError, match="ring .* does not hold 2 contiguous rows of 96 torch.float16"):
            gs.greedy_accept(one_node, root[:, None], logits, hidden, lengths, root,
                             ring=HiddenRing(bad, ring.slot, ring.count))


@pytest.mark.parametrize("n, dtype", [pytest.param(12, F32, marks=QUICK), (63, BF16),
                                      pytest.param(255, BF16, marks=QUICK)], ids=dtype_id)
def test_trace_fields_match_reference(n, dtype):
    """Every field of decode.trace_fields under greedy acceptance; probabilities (in millionths) to
    float32's precision (`micro_tolerance`): both add up float32 log-sum-exps, in other orders."""
    g, buf, head_logits, root, start = _step_inputs(n, 3, 3000, ("trace", n, dtype))
    tokens = decode.draft(decode.DecodeState(start, start.tolist(), root, head_logits), buf)
    logits = (torch.randn(*tokens.shape, 3000, generator=g) * 7).to(dtype).to(DEV)
    logits[0, buf.parent.clamp(min=0)[1:], tokens[0, 1:]] = 50.0  # request 0: a child of each parent is its argmax
    width = decode.trace_width(buf.num_nodes, head_logits.shape[1], buf.topk)
    packed = torch.full((3, 7 + width), -7, dtype=torch.long, device=DEV)
    gs.trace_fields(packed[:, 7:], tokens, buf.parent, logits, gs.row_topk(logits, 1), gs.row_topk(head_logits, buf.topk),
                    buf.topk)
    want = decode.trace_fields(logits.float(), tokens, buf.parent, head_logits, buf.topk)
    got = packed[:, 7:]
    t = buf.num_nodes
    assert (packed[:, :7] == -7).all()  # the packed step's own columns are left alone
    exact = list(range(0, 2 * t)) + list(range(4 * t, 5 * t)) + list(range(5 * t, 5 * t + head_logits.shape[1] * buf.topk))
    assert torch.equal(got[:, exact], want[:, exact])
    assert (got - want).abs().max() <= micro_tolerance(logits, head_logits)
    assert (got[0, 4 * t + 1: 5 * t] == decode.MICRO).sum() > t // 4  # the case happened: nodes the rule keeps


@QUICK
@pytest.mark.parametrize("with_heads", [True, False], ids=["heads", "no_heads"])
def test_ar_trace_fields_match_reference(with_heads):
    """An AR step's trace (a one-node tree; the heads' fields only when heads drafted), from float32
    logits read through a [B, 1, V] view."""
    g = gen_of("ar trace", with_heads)
    logits = torch.randn(3, 5000, generator=g).to(DEV) * 7
    root = torch.randint(0, 5000, (3,), generator=g).to(DEV)
    head_logits = torch.randn(3, 4, 5000, generator=g).to(DEV) if with_heads else None
    parent = torch.tensor([-1], device=DEV)
    heads = gs.row_topk(head_logits, 10) if with_heads else None
    out = torch.empty(3, decode.trace_width(1, 4 if with_heads else 0, 10), dtype=torch.long, device=DEV)
    gs.trace_fields(out, root[:, None], parent, logits[:, None], gs.row_topk(logits[:, None], 1), heads, 10)
    want = decode.trace_fields(logits[:, None], root[:, None], parent, head_logits, 10)
    assert out.shape == want.shape and (out - want).abs().max() <= micro_tolerance(logits, head_logits)
    assert torch.equal(out[:, :2], want[:, :2]) and (out[:, 3:5] == -1).all()


@QUICK
def test_row_topk_ties_and_empty_chunks():
    """Ties at the maximum inside a chunk and across chunks go to the smallest index (torch.argmax's
    first maximum, which greedy Medusa == AR rests on), and a chunk of only -inf leaves the
    log-sum-exp finite."""
    x = torch.zeros(1, 4, 6000, dtype=BF16)
    x[0, 1, [100, 5000]] = 1
    x[0, 2, [4000, 2047, 2048]] = 2
    x[0, 3, :2048] = float("-inf")
    x = x.to(DEV)
    got = gs.row_topk(x, 1)
    flat = x.float().flatten(0, 1)
    assert got.ids[:, 0].tolist() == flat.argmax(-1).tolist() == [0, 100, 2047, 2048]
    torch.testing.assert_close(got.lse, flat.logsumexp(-1), rtol=1e-5, atol=1e-5)
    assert gs.row_topk(x, 3).ids.tolist()[2] == [2047, 2048, 4000]
    assert_chunks_skip_only_the_lse(x, 3)
