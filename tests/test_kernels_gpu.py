"""Every Triton kernel against its torch reference on random inputs (GPU only): tree attention
(dtypes, head dims, GQA ratios, lengths per request, NaN garbage past each live length, many idle
splits), the split merge, compaction, RoPE + cache write, and the fused norm and SwiGLU kernels.
Seeds are fixed per case (crc32 of the case name: Python's hash() is salted per process)."""

import zlib

import pytest
import torch
from conftest import QUICK, grid

import trees

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
pytestmark = [pytest.mark.gpu, cuda]


def seed_of(*case) -> int:
    return zlib.crc32(repr(case).encode())


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


def rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


TOL = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}


F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
ATTN_LENGTHS = [(1, (1, 4095)), (16, (0, 1000)), (64, (4095, 17)), (127, (333, 2)), (128, (2500, 2500))]


@pytest.mark.parametrize("dtype, d, groups, t, starts", grid(
    [F16, BF16, F32], [64, 128], [1, 4, 8], ATTN_LENGTHS,
    quick=[(BF16, 64, 4, 16, (0, 1000)), (F32, 128, 1, 127, (333, 2)), (F16, 128, 8, 1, (1, 4095)),
           (BF16, 128, 1, 128, (2500, 2500))]))
def test_tree_attention_matches_reference(dtype, d, groups, t, starts):
    from engine.kernels.tree_attention import tree_attention, tree_attention_reference

    seed = seed_of("attn", dtype, d, groups, t, starts)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    hkv, b = 2, len(starts)
    st = torch.tensor(starts, device="cuda")
    cap = max(starts) + t + 300  # slots past each request's live length hold NaN the kernel must not read
    q = torch.randn(b, hkv * groups, t, d, device="cuda", generator=gen).to(dtype)
    k = torch.randn(b, hkv, cap, d, device="cuda", generator=gen).to(dtype)
    v = torch.randn(b, hkv, cap, d, device="cuda", generator=gen).to(dtype)
    for r, s in enumerate(starts):
        k[r, :, s + t:] = float("nan")
        v[r, :, s + t:] = float("nan")
    mask = trees.buffers(random_tree(t - 1, seed)).attn_mask.cuda() if t > 1 else None
    bits = trees.pack_mask_bits((mask if mask is not None else torch.ones(1, 1, dtype=torch.bool)).cpu()).cuda()
    out = tree_attention(q, k, v, st, tree_bits=bits)
    ref = tree_attention_reference(q.double(), k.double().nan_to_num(), v.double().nan_to_num(), st, mask)
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("dtype", [pytest.param(BF16, marks=QUICK), F32], ids=["bf16", "fp32"])
def test_tree_attention_does_work_for_the_live_length_inside_a_big_cache(dtype):
    """One launch shape for a 32k-slot cache (as a CUDA graph captures it) and live lengths from 3
    to 30000: idle splits contribute nothing, and the result is right at every length."""
    from engine.kernels.tree_attention import tree_attention, tree_attention_reference

    gen = torch.Generator(device="cuda").manual_seed(seed_of("live", dtype))
    t, cap = 16, 32768
    q = torch.randn(1, 32, t, 128, device="cuda", generator=gen).to(dtype)
    k = torch.randn(1, 8, cap, 128, device="cuda", generator=gen).to(dtype)
    v = torch.randn(1, 8, cap, 128, device="cuda", generator=gen).to(dtype)
    mask = trees.buffers(random_tree(t - 1, 3)).attn_mask.cuda()
    bits = trees.pack_mask_bits(mask.cpu()).cuda()
    start = torch.zeros(1, dtype=torch.long, device="cuda")
    for live in (3, 300, 5000, 30000):
        start.fill_(live)
        kk, vv = k.clone(), v.clone()
        kk[:, :, live + t:] = float("nan")
        vv[:, :, live + t:] = float("nan")
        out = tree_attention(q, kk, vv, start, tree_bits=bits)
        ref = tree_attention_reference(q.double(), k[:, :, : live + t].double(), v[:, :, : live + t].double(), live, mask)
        assert not torch.isnan(out).any() and rel_err(out, ref) < TOL[dtype], live


@pytest.mark.parametrize("dtype, d, n", grid([BF16, F32], [64, 128, 80], [1, 5, 33, 65],
                                             quick=[(BF16, 128, 65), (F32, 80, 5)]))
def test_compaction_kernel_matches_reference(dtype, d, n):
    """One launch moves the accepted slots of every layer, request and head; overlapping source and
    destination ranges, padding by repeating the last pair, and rows past the batch left alone."""
    from engine.kernels.compact import compact, compact_reference

    gen = torch.Generator(device="cuda").manual_seed(seed_of("compact", dtype, d, n))
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


@pytest.mark.parametrize("dtype, hq, hkv, d", grid([BF16, F16, F32], [(32, 32, 128), (32, 8, 128), (6, 2, 64)],
                                                  quick=[(BF16, 32, 8, 128), (F32, 6, 2, 64)]))
def test_rope_and_cache_write_kernel_matches_reference(dtype, hq, hkv, d):
    from engine.kernels import rope

    gen = torch.Generator(device="cuda").manual_seed(seed_of("rope", dtype, hq, hkv, d))
    b, t = 3, 17
    qkv = torch.randn(b, t, (hq + 2 * hkv) * d, device="cuda", generator=gen).to(dtype)
    start = torch.tensor([0, 100, 4000], device="cuda")
    pos = start[:, None] + torch.randint(0, 5, (b, t), device="cuda", generator=gen)
    inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device="cuda").float() / d))
    ck = torch.full((4, hkv, 4100, d), float("nan"), device="cuda", dtype=dtype)
    cv = ck.clone()
    q = rope.rope_qkv_to_cache(qkv, pos, inv, ck, cv, start, hq, hkv)
    rq, rk, rv = qkv.split([hq * d, hkv * d, hkv * d], -1)
    rq, rk, rv = (x.view(b, t, -1, d).transpose(1, 2) for x in (rq, rk, rv))
    rq, rk = rope.rope_reference(rq, rk, *rope.rope_tables(pos, inv, dtype))
    wk, wv = torch.full_like(ck, float("nan")), torch.full_like(cv, float("nan"))
    rope.write_cache_reference(wk, wv, rk, rv, start)
    # the kernel rounds where the reference rounds; libdevice's and torch's cos/sin may differ by an ulp
    tol = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(q, rq, atol=tol, rtol=tol)
    torch.testing.assert_close(ck, wk, atol=tol, rtol=tol, equal_nan=True)
    assert torch.equal(cv.nan_to_num(7), wv.nan_to_num(7))


@pytest.mark.parametrize("dtype, dim", grid([BF16, F16, F32], [384, 4096, 5120], quick=[(BF16, 5120), (F32, 384)]))
def test_norm_swiglu_and_resblock_kernels_match_references(dtype, dim):
    from engine.kernels import pointwise as pw

    gen = torch.Generator(device="cuda").manual_seed(seed_of("pointwise", dtype, dim))
    x = torch.randn(7, 3, dim, device="cuda", generator=gen).to(dtype)
    r = torch.randn(7, 3, dim, device="cuda", generator=gen).to(dtype)
    w = torch.randn(dim, device="cuda", generator=gen).to(dtype)
    want_x, want_h = pw.add_rms_norm_reference(x.clone(), r, w, 1e-5)
    got_x, got_h = pw.add_rms_norm(x.clone(), r, w, 1e-5)
    assert torch.equal(got_x, want_x)
    # fp32 sums in another order: a rounding step of the model dtype at most
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(got_h, want_h, atol=tol * 4, rtol=tol)
    _, got = pw.add_rms_norm(x.clone(), None, w, 1e-5)
    torch.testing.assert_close(got, pw.rms_norm_reference(x, w, 1e-5), atol=tol * 4, rtol=tol)
    gu = torch.randn(5, 2 * dim, device="cuda", generator=gen).to(dtype)
    torch.testing.assert_close(pw.silu_mul(gu), pw.silu_mul_reference(gu), atol=tol, rtol=tol)
    # a Medusa ResBlock's tail: the heads' shared hidden state expanded over 4 heads, then a residual of its own
    y = torch.randn(4, 3, dim, device="cuda", generator=gen).to(dtype)
    wide = torch.randn(4, 3, 2 * dim, device="cuda", generator=gen).to(dtype)
    # expanded; its own; a column slice (a tensor-parallel rank's: an offset, rows wider than dim); strided columns.
    # exp's last bit may differ from torch's, so SiLU may round one step of the dtype apart, which survives the
    # residual's cancellation: a small tolerance, and in bf16/fp16 few elements apart at all (a rounding skipped or
    # moved changed 27-29 % of fp16 outputs under Triton's interpreter). In float32 there is no rounding to skip,
    # and the kernel's exp and division compile to approximate PTX (ex2.approx, div.full), which differ from
    # torch's in the last bits of many elements: the tolerance alone
    for residual in (x[0].expand(4, -1, -1), y.flip(0), wide[..., dim:], wide[..., ::2]):
        got, want = pw.residual_silu(residual, y), pw.residual_silu_reference(residual, y)
        torch.testing.assert_close(got, want, atol=tol * 4, rtol=tol)
        assert dtype == torch.float32 or (got != want).float().mean() < 0.01


def test_engine_greedy_medusa_equals_ar_with_every_backend_in_fp32():
    import engine
    from engine.prompts import heldout_prompts

    ref = engine.load("demo", device="cuda", dtype="float32", backend="sdpa", cuda_graphs=False)
    for backend in ("triton", "sdpa"):
        for graphs in (False, True):
            eng = engine.load("demo", device="cuda", dtype="float32", backend=backend, cuda_graphs=graphs)
            for p in heldout_prompts(3):
                ar = ref.generate(p, 64, mode="ar")
                for tree in ("mc_sim_7b_63", "demo_tuned"):
                    assert eng.generate(p, 64, mode="medusa", tree=tree).token_ids == ar.token_ids, (backend, graphs)
                assert eng.generate(p, 64, mode="ar").token_ids == ar.token_ids, (backend, graphs)


@QUICK
def test_batched_triton_equals_single_sdpa():
    import engine
    from engine.prompts import heldout_prompts

    eng = engine.load("demo", device="cuda", dtype="float32", backend="triton", cuda_graphs=False)
    ref = engine.load("demo", device="cuda", dtype="float32", backend="sdpa", cuda_graphs=False)
    batch = heldout_prompts(5)
    want = [ref.generate(p, 64, mode="ar").token_ids for p in batch]
    assert [r.token_ids for r in eng.generate(batch, 64, mode="medusa", tree="mc_sim_7b_63")] == want
    assert [r.token_ids for r in eng.generate(batch, 64, mode="ar")] == want


@pytest.mark.parametrize("dtype, m, n, k", grid([BF16, F16], [1, 3, 16, 40, 64],
                                             [(4096, 4096), (12288, 4096), (4096, 11008), (1000, 384), (256, 8192)],
                                             quick=[(BF16, 3, 4096, 4096), (F16, 40, 256, 8192)]))
def test_skinny_gemm_matches_reference(dtype, m, n, k):
    """Both paths: one program per output block (large N) and split-K with atomics (small N)."""
    from engine.kernels import gemv

    gen = torch.Generator(device="cuda").manual_seed(seed_of("gemv", dtype, m, n, k))
    x = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
    w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).to(dtype)
    b = torch.randn(n, device="cuda", generator=gen).to(dtype)
    for bias in (None, b):
        ref = gemv.linear_reference(x.double(), w.double(), bias.double() if bias is not None else None)
        for _ in range(2):  # the second call runs the tuned config from the cache
            out = gemv.linear(x, w, bias)
            assert out.dtype == dtype and out.shape == (m, n)
            assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("m, n, k", grid([1, 64], [(4096, 4096), (4096, 11008), (1000, 384)],
                                        quick=[(64, 4096, 4096)]))
def test_every_skinny_config_matches_reference(m, n, k):
    """Autotuning runs one config per shape, so the shape tests above reach only the winners: here every config
    the tuner may time for this shape (each block shape with each split it allows) runs and must be exact."""
    from triton.runtime.errors import OutOfResources

    from engine.kernels import gemv

    gen = torch.Generator(device="cuda").manual_seed(seed_of("gemv-configs", m, n, k))
    x = torch.randn(m, k, device="cuda", generator=gen).to(BF16)
    w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).to(BF16)
    b = torch.randn(n, device="cuda", generator=gen).to(BF16)
    configs = gemv._worth_timing(gemv._skinny.configs, {"N": n, "SM": gemv.sm_count(x.device)},
                                 M_BLOCK=max(16, 1 << (m - 1).bit_length()), GATED=False)
    assert {c.kwargs["SPLIT_K"] for c in configs} - {1}, "no config splits K here: the split path goes untested"
    ran = 0
    for c in configs:
        for bias in (None, b):
            try:
                out = gemv.launch(gemv._skinny.fn, x, w, bias, **c.all_kwargs())
            except OutOfResources:
                continue
            ref = gemv.linear_reference(x.double(), w.double(), bias.double() if bias is not None else None)
            assert rel_err(out, ref) < TOL[BF16], c
            ran += 1
    assert ran >= len(configs)  # at most half were too large for shared memory
    assert not gemv.split_counters(x.device).any(), "a split left its counter set: the next call would go wrong"


@pytest.mark.parametrize("n, k", [pytest.param(4096, 11008, marks=QUICK), pytest.param(576, 1536, marks=QUICK),
                                  (1000, 384)])
def test_gated_skinny_gemm_is_the_activation_then_the_gemm(n, k):
    """The down projection of one row with its activation applied as x is loaded (`gated`) must give the bits of
    the activation kernel followed by the same GEMM config, for every config the tuner may time for it (Llama-2-7B's
    and SmolLM2's down projections, and an N that splits K unevenly); as tuned, it equals the float64 reference.
    More rows are refused (the model runs them through the activation kernel)."""
    from triton.runtime.errors import OutOfResources

    from engine.kernels import gemv, pointwise

    gen = torch.Generator(device="cuda").manual_seed(seed_of("gemv-gated", n, k))
    gate_up = (torch.randn(1, 2 * k, device="cuda", generator=gen) * 3).to(BF16)
    w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).to(BF16)
    b = torch.randn(n, device="cuda", generator=gen).to(BF16)
    act = pointwise.silu_mul(gate_up)
    configs = gemv._worth_timing(gemv._skinny.configs, {"N": n, "SM": gemv.sm_count(w.device)}, M_BLOCK=16, GATED=True)
    ran = 0
    for c in configs:
        try:
            gated = gemv.launch(gemv._skinny.fn, gate_up, w, b, gated=True, **c.all_kwargs())
        except OutOfResources:
            continue
        assert torch.equal(gated, gemv.launch(gemv._skinny.fn, act, w, b, **c.all_kwargs())), c
        ran += 1
    assert ran >= len(configs) // 2
    ref = gemv.linear_reference(gate_up.double(), w.double(), b.double(), gated=True)
    assert rel_err(gemv.linear(gate_up, w, b, gated=True), ref) < TOL[BF16]
    assert not gemv.split_counters(w.device).any()
    with pytest.raises(ValueError, match="input of 11 columns for a weight of"):
        gemv.launch(gemv._skinny, gate_up[:, :11], w, b, gated=True)
    with pytest.raises(ValueError, match="a gated input has one row, not 2"):
        gemv.launch(gemv._skinny, gate_up.expand(2, -1).contiguous(), w, b, gated=True)


@QUICK
def test_split_k_gemms_replayed_from_one_graph_stay_exact():
    """Split-K's last-arriving split adds the partials, counted on the device's counters, which it sets back to
    zero: GEMMs (as tuned, plus one forced to split K 8 ways and one forced not to split; one with bias) captured
    into one CUDA graph and replayed on new inputs must equal the reference every replay, as a step's graph runs
    them, and leave every counter at zero."""
    from engine.kernels import gemv

    gen = torch.Generator(device="cuda").manual_seed(seed_of("gemv-graph"))
    shapes = [(1, 4096, 4096), (16, 1000, 384), (3, 12288 * 2, 4096)]
    xs = [torch.randn(m, k, device="cuda", generator=gen).to(BF16) for m, _, k in shapes]
    ws = [(torch.randn(n, k, device="cuda", generator=gen) / k**0.5).to(BF16) for _, n, k in shapes]
    bias = torch.randn(1000, device="cuda", generator=gen).to(BF16)
    bs = [None, bias, None]
    forced = [(0, dict(BLOCK_N=128, BLOCK_K=128, SPLIT_K=8, num_warps=8, num_stages=3)),
              (1, dict(BLOCK_N=64, BLOCK_K=128, SPLIT_K=1, num_warps=4, num_stages=4))]

    def gemms():
        return ([gemv.linear(x, w, b) for x, w, b in zip(xs, ws, bs)]
                + [gemv.launch(gemv._skinny.fn, xs[i], ws[i], bs[i], **c) for i, c in forced])

    gemms()  # tune and compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = gemms()
    which = [0, 1, 2] + [i for i, _ in forced]
    for _ in range(3):
        for x in xs:
            x.copy_(torch.randn(x.shape, device="cuda", generator=gen).to(BF16))
        graph.replay()
        torch.cuda.synchronize()
        for i, out in zip(which, outs):
            b = bs[i]
            ref = gemv.linear_reference(xs[i].double(), ws[i].double(), b.double() if b is not None else None)
            assert rel_err(out, ref) < TOL[BF16]
        assert not gemv.split_counters(xs[0].device).any()


@QUICK
def test_auto_gemm_times_on_the_gpu_and_stays_exact():
    """`gemm=auto` (engine/gemm_choice.py) times cuBLAS and ours over every layer of a shape (cloned past the L2),
    then runs the faster: the output is exactly the chosen kernel's and equals the reference, bias or not; a row
    bucket first met inside a graph capture runs cuBLAS there, untimed, and is timed at its first eager call."""
    from torch import nn

    from engine.gemm_choice import GemmChoice
    from engine.kernels import gemv

    gen = torch.Generator(device="cuda").manual_seed(seed_of("gemm-auto"))
    layers = [nn.Linear(4096, 1024, bias=i == 0, device="cuda", dtype=BF16) for i in range(4)]
    with torch.no_grad():
        for layer in layers:
            layer.weight.copy_(torch.randn(layer.weight.shape, device="cuda", generator=gen) / 64)
    choice = GemmChoice("auto", layers)
    for rows in (1, 40):
        x = torch.randn(rows, 4096, device="cuda", generator=gen).to(BF16)
        for layer in layers[:2]:
            out = choice.linear(layer, x)
            kernel = choice.chosen()[-1]["kernel"]
            ran = gemv.linear(x, layer.weight, layer.bias) if kernel == "skinny" else layer(x)
            assert torch.equal(out, ran), kernel  # each kernel is deterministic for one shape: this one ran
            ref = gemv.linear_reference(x.double(), layer.weight.double(),
                                        layer.bias.double() if layer.bias is not None else None)
            assert rel_err(out, ref) < TOL[BF16]
    timed = choice.chosen()
    assert [(t["N"], t["K"], t["rows"]) for t in timed] == [(1024, 4096, 1), (1024, 4096, 64)]  # 40 rows: bucket 64
    assert all(t["cublas_us"] > 0 and t["ours_us"] > 0 for t in timed)
    x = torch.randn(7, 4096, device="cuda", generator=gen).to(BF16)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = choice.linear(layers[1], x)
    graph.replay()
    torch.cuda.synchronize()
    assert len(choice.chosen()) == 2 and rel_err(out, gemv.linear_reference(x.double(), layers[1].weight.double())) < TOL[BF16]
    choice.linear(layers[1], x)
    assert len(choice.chosen()) == 3


@pytest.mark.parametrize("gemm", [pytest.param("skinny", marks=QUICK), "auto"])
def test_model_with_our_gemm_matches_cublas(gemm):
    """The demo model's trained weights in bf16, fused, with its projections through `gemm` (skinny: ours at
    every row count it takes; auto: whichever it timed faster, which at the demo's shape was cuBLAS on an H100,
    so there it checks the timing inside a forward), against the same weights on cuBLAS: a prefill of 100
    tokens (cuBLAS: past 64 rows), then blocks of 1, 13 and 64. Both are bf16 approximations of the float32
    model: over the 78 positions after the prefill ours must be within twice cuBLAS's error of it (a wrong
    kernel is off by the size of the hidden states; two bf16 roundings of one model differ by far less)."""
    import engine

    exact = engine.load("demo", device="cuda", dtype="float32", backend="triton").model
    ref = engine.load("demo", device="cuda", dtype="bfloat16", backend="triton").model
    ours = engine.load("demo", device="cuda", dtype="bfloat16", backend="triton", gemm=gemm).model
    assert ref.gemm == "cublas" and ours.gemm == gemm
    gen = torch.Generator().manual_seed(seed_of("model-gemm", gemm))
    tokens = torch.randint(0, ref.args.vocab_size, (1, 100 + 78), generator=gen).cuda()
    outs = []
    with torch.inference_mode():
        for model in (exact, ref, ours):
            model.setup_cache(1, 256)
            hs, start = [], 0
            for t in (100, 1, 13, 64):
                block = torch.ones(t, t, dtype=torch.bool).tril()
                hs.append(model(tokens[:, start:start + t], torch.arange(start, start + t, device="cuda"), start=start,
                                block_mask=block).double())
                start += t
            outs.append(hs)
    h_exact, h_ref, h_ours = (torch.cat(hs[1:], dim=1) for hs in outs)
    assert rel_err(h_ours, h_exact) <= 2 * rel_err(h_ref, h_exact)
    if gemm == "auto":
        assert {c["rows"] for c in ours.gemm_choice.chosen()} == {1, 16, 64}  # 13 rows: the bucket of 16
