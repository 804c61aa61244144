"""The flash_attn backend (FlashAttention-4 with the tree as a mask_mod) against the reference
(GPU with FA4 importable, else skipped with the reason). FA4 runs bf16/fp16 only, so its tests
compare at those precisions; the fp32 losslessness tests cover the other backends."""

import pytest
import torch
from test_kernels_gpu import TOL, random_tree, rel_err, seed_of

import engine
import trees
from engine.kernels import flash4
from engine.prompts import heldout_prompts

why = flash4.unavailable_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(why is not None, reason=why or "")]


def _inputs(dtype, b, hq, hkv, t, d, cap, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, hq, t, d, device="cuda", generator=gen).to(dtype)
    k = torch.randn(b, hkv, cap, d, device="cuda", generator=gen).to(dtype)
    v = torch.randn(b, hkv, cap, d, device="cuda", generator=gen).to(dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("d, groups", [(128, 1), (128, 4), (64, 3)])
@pytest.mark.parametrize("t, starts", [(1, (1, 4095)), (16, (0, 1000)), (64, (4095, 17)), (127, (333, 2))])
def test_flash4_matches_reference(dtype, d, groups, t, starts):
    from engine.kernels.tree_attention import tree_attention_reference

    seed = seed_of("fa4", dtype, d, groups, t, starts)
    hkv, b = 2, len(starts)
    cap = max(starts) + t + 300
    q, k, v = _inputs(dtype, b, hkv * groups, hkv, t, d, cap, seed)
    st = torch.tensor(starts, device="cuda")
    for r, s in enumerate(starts):  # finite garbage past each live length (FA4 multiplies P = 0 by it)
        k[r, :, s + t:] = 30.0
        v[r, :, s + t:] = -1e3
    mask = trees.buffers(random_tree(t - 1, seed)).attn_mask.cuda() if t > 1 else None
    out = flash4.flash4_attention(q, k, v, flash4.live_lengths(st, t, b, q.device),
                                  flash4.visible_table(mask) if mask is not None else None)
    ref = tree_attention_reference(q.double(), k.double(), v.double(), st, mask)
    assert out.shape == q.shape and not torch.isnan(out).any()
    assert rel_err(out, ref) < TOL[dtype]


def test_flash4_in_a_cuda_graph_follows_the_live_length():
    """One capture at a 32k-slot cache; live lengths 3..30000 set on the device between replays."""
    from engine.kernels.tree_attention import tree_attention_reference

    t, cap, dtype = 16, 32768, torch.bfloat16
    q, k, v = _inputs(dtype, 1, 32, 8, t, 128, cap, seed_of("fa4-live"))
    mask = trees.buffers(random_tree(t - 1, 3)).attn_mask.cuda()
    visible = flash4.visible_table(mask)
    start = torch.zeros(1, dtype=torch.long, device="cuda")
    seqused = flash4.live_lengths(start, t, 1, q.device)
    for _ in range(2):  # compile and warm up outside the capture
        flash4.flash4_attention(q, k, v, seqused, visible)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = flash4.flash4_attention(q, k, v, seqused, visible)
    for live in (3, 300, 5000, 30000):
        seqused.fill_(live + t)
        g.replay()
        ref = tree_attention_reference(q.double(), k[:, :, : live + t].double(), v[:, :, : live + t].double(), live, mask)
        assert rel_err(out, ref) < TOL[dtype], live


def test_flash4_forward_of_the_demo_matches_sdpa():
    """The whole model: a causal prefill, then a tree block at per-request starts (batch 2)."""
    eng = engine.load("demo", device="cuda", dtype="bfloat16", backend="flash_attn", cuda_graphs=False)
    model = eng.model
    prompts = [eng.encode(p) for p in heldout_prompts(2)]
    n = min(len(p) for p in prompts)
    tokens = torch.tensor([p[:n] for p in prompts], device="cuda")
    buf = trees.buffers(trees.resolve("mc_sim_7b_63")).to("cuda")
    nodes = torch.randint(0, model.args.vocab_size, (2, buf.num_nodes), device="cuda",
                          generator=torch.Generator(device="cuda").manual_seed(5))
    starts = torch.tensor([n, n - 7], device="cuda")
    outs = {}
    with torch.inference_mode():
        for backend in ("sdpa", "flash_attn"):
            model.backend = backend
            model.setup_cache(2, 512)
            pre = model(tokens, torch.arange(n, device="cuda"), start=0)
            positions = starts[:, None] + buf.position_ids[None]
            tree_h = model(nodes, positions, start=starts, block_mask=buf.attn_mask, span=n + buf.num_nodes)
            outs[backend] = (pre.float(), tree_h.float())
    for got, want in zip(outs["flash_attn"], outs["sdpa"]):
        assert ((got - want).norm() / want.norm()).item() < 2e-2


@pytest.mark.parametrize("backend", ["triton", "flash_attn"])
def test_graphed_medusa_equals_ar_in_fp16(backend):
    """Greedy Medusa == AR with CUDA graphs at fp16 (FA4 has no fp32). Rounding could in principle
    flip a near-tie; the triton case is the control for that."""
    eng = engine.load("demo", device="cuda", dtype="float16", backend=backend)
    assert eng.graphs is not None
    for p in heldout_prompts(3):
        want = eng.generate(p, 64, mode="ar").token_ids
        assert eng.generate(p, 64, mode="medusa", tree="mc_sim_7b_63").token_ids == want, (backend, p)
