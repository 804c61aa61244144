"""Our Triton tree-attention kernel against the SDPA reference (fp32) on random inputs and trees."""

import pytest
import torch

import trees

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
pytestmark = [pytest.mark.gpu, cuda]


def random_tree(n, seed, topk=10, depth=6):
    g = torch.Generator().manual_seed(seed)
    paths = []
    while len(paths) < n:
        options = [[]] + [p for p in paths if len(p) < depth]
        parent = options[int(torch.randint(0, len(options), (1,), generator=g))]
        child = parent + [int(torch.randint(0, topk, (1,), generator=g))]
        if child not in paths:
            paths.append(child)
    return paths


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("groups", [1, 4, 8])
@pytest.mark.parametrize("t, start", [(1, 1), (1, 777), (16, 0), (16, 1000), (64, 4095), (127, 333), (128, 2500)])
def test_kernel_matches_reference(dtype, d, groups, t, start):
    from engine.attention import sdpa_attention
    from engine.kernels.tree_attention import tree_attention

    seed = hash((str(dtype), d, groups, t, start)) % 2**31
    gen = torch.Generator(device="cuda").manual_seed(seed)
    hkv = 2
    hq = hkv * groups
    cap = start + t + 37  # slots past the live length hold garbage the kernel must not read
    q = torch.randn(2, hq, t, d, device="cuda", generator=gen).to(dtype)
    k = torch.randn(2, hkv, cap, d, device="cuda", generator=gen).to(dtype)
    v = torch.randn(2, hkv, cap, d, device="cuda", generator=gen).to(dtype)
    k[:, :, start + t:] = float("nan")
    v[:, :, start + t:] = float("nan")
    mask = trees.buffers(random_tree(t - 1, seed)).attn_mask.cuda() if t > 1 else None
    out = tree_attention(q, k, v, start, mask)
    ref = sdpa_attention(q.double(), k.double(), v.double(), start, mask)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert not torch.isnan(out).any()
    assert err < (1e-5 if dtype == torch.float32 else 1e-2), err


def test_engine_greedy_medusa_with_triton_equals_ar():
    import engine
    from engine.prompts import heldout_prompts

    eng = engine.load("demo", device="cuda", dtype="float32", backend="triton", cuda_graphs=False)
    ref = engine.load("demo", device="cuda", dtype="float32", backend="sdpa", cuda_graphs=False)
    for p in heldout_prompts(3):
        ar = ref.generate(p, 64, mode="ar")
        for tree in ("mc_sim_7b_63", "demo_tuned"):
            assert eng.generate(p, 64, mode="medusa", tree=tree).token_ids == ar.token_ids
        assert eng.generate(p, 64, mode="ar").token_ids == ar.token_ids


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("groups", [1, 4])
def test_kernel_with_per_request_lengths_matches_reference(dtype, groups):
    """Requests of one batch at different lengths (read from a device tensor), span = the longest."""
    from engine.attention import sdpa_attention
    from engine.kernels.tree_attention import tree_attention

    gen = torch.Generator(device="cuda").manual_seed(groups)
    t, d, hkv = 16, 128, 2
    starts = torch.tensor([5, 4000, 0 + 1, 777], device="cuda")
    span = int(starts.max()) + t
    q = torch.randn(4, hkv * groups, t, d, device="cuda", generator=gen).to(dtype)
    k = torch.randn(4, hkv, span, d, device="cuda", generator=gen).to(dtype)
    v = torch.randn(4, hkv, span, d, device="cuda", generator=gen).to(dtype)
    mask = trees.buffers(random_tree(t - 1, 7)).attn_mask.cuda()
    out = tree_attention(q, k, v, starts, mask)
    ref = sdpa_attention(q.double(), k.double(), v.double(), starts, mask)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < (1e-5 if dtype == torch.float32 else 1e-2), err


def test_batched_triton_equals_single_sdpa():
    import engine
    from engine.prompts import heldout_prompts

    eng = engine.load("demo", device="cuda", dtype="float32", backend="triton", cuda_graphs=False)
    ref = engine.load("demo", device="cuda", dtype="float32", backend="sdpa", cuda_graphs=False)
    batch = heldout_prompts(5)
    want = [ref.generate(p, 64, mode="ar").token_ids for p in batch]
    assert [r.token_ids for r in eng.generate(batch, 64, mode="medusa", tree="mc_sim_7b_63")] == want
    assert [r.token_ids for r in eng.generate(batch, 64, mode="ar")] == want


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("d", [64, 128, 80])
@pytest.mark.parametrize("n", [1, 5, 33, 65])
def test_compaction_kernel_matches_reference(dtype, d, n):
    """One launch moves the accepted slots of every layer, request and head; overlapping source and
    destination ranges, padding by repeating the last pair, and rows past the batch left alone."""
    from engine.kernels.compact import compact
    from engine.model import compact_reference

    gen = torch.Generator(device="cuda").manual_seed(n * d)
    layers, b_cap, heads, cap = 3, 4, 2, 300  # 3 requests in a cache of 4 rows
    k = torch.randn(layers, b_cap, heads, cap, d, device="cuda", generator=gen).to(dtype)
    v = torch.randn(layers, b_cap, heads, cap, d, device="cuda", generator=gen).to(dtype)
    starts = torch.tensor([0, 17, 150], device="cuda")
    kept = torch.tensor([n, max(1, n // 2), 1], device="cuda")
    nodes = torch.sort(torch.randperm(n + 40, generator=torch.Generator().manual_seed(n))[:n]).values.cuda()
    nodes[0] = 0  # the root is always kept and always first
    steps = torch.arange(n, device="cuda")
    src = starts[:, None] + torch.where(steps[None] < kept[:, None], nodes[None], nodes[torch.clamp(kept - 1, min=0)][:, None])
    dst = starts[:, None] + torch.minimum(steps[None], kept[:, None] - 1)
    want_k, want_v = k.clone(), v.clone()
    compact_reference(want_k, want_v, src, dst)
    compact(k, v, src, dst)
    assert torch.equal(k, want_k) and torch.equal(v, want_v)
