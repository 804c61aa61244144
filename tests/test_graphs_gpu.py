"""Greedy steps replayed from CUDA graphs give exactly the eager engine's output (GPU only)."""

import pytest
import torch
from conftest import QUICK, make_hf_model, random_heads_sd

import engine
import trees
from engine.kernels import pdl
from engine.prompts import heldout_prompts

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
pytestmark = [pytest.mark.gpu, cuda]
TREES = ("mc_sim_7b_63", "demo_tuned", "chain_3")


@pytest.fixture(scope="module")
def eager():
    return engine.load("demo", device="cuda", dtype="float32", backend="sdpa", cuda_graphs=False)


@pytest.mark.parametrize("backend", [pytest.param("triton", marks=QUICK), "sdpa"])
def test_graphed_medusa_and_ar_equal_eager_ar_on_the_demo(eager, backend):
    eng = engine.load("demo", device="cuda", dtype="float32", backend=backend)
    assert eng.graphs is not None and eager.graphs is None
    for p in heldout_prompts(4):
        want = eager.generate(p, 96, mode="ar").token_ids
        assert eng.generate(p, 96, mode="ar").token_ids == want
        for tree in TREES:
            assert eng.generate(p, 96, mode="medusa", tree=tree).token_ids == want, (p, tree)
    captured = eng.graphs.captures
    eng.generate(heldout_prompts(1)[0], 32, mode="medusa", tree="mc_sim_7b_63")
    assert eng.graphs.captures == captured  # same tree, batch and cache: the graph is replayed, not captured again


@QUICK
def test_graphed_batch_with_requests_leaving_equals_eager(eager):
    eng = engine.load("demo", device="cuda", dtype="float32", backend="triton")
    batch = heldout_prompts(5)
    want = [eager.generate(p, 64, mode="ar").token_ids for p in batch]
    got = eng.generate(batch, 64, mode="medusa", tree="mc_sim_7b_63")
    assert [r.token_ids for r in got] == want
    captured = eng.graphs.captures  # requests left at different steps: one graph per batch size seen
    again = eng.generate(batch, 64, mode="medusa", tree="mc_sim_7b_63")
    assert [r.token_ids for r in again] == want and eng.graphs.captures == captured  # the cache stayed in place
    assert [r.token_ids for r in eng.generate(batch, 64, mode="ar")] == want


@QUICK
def test_graphed_traces_equal_eager_traces(eager):
    eng = engine.load("demo", device="cuda", dtype="float32", backend="triton")
    p = heldout_prompts(1)[0]
    for mode in ("ar", "medusa"):
        a = eager.generate(p, 40, mode=mode, tree="demo_tuned", trace=True).traces
        b = eng.generate(p, 40, mode=mode, tree="demo_tuned", trace=True).traces
        keys = ("accepted_tokens", "accepted_nodes", "node_tokens", "target_argmax")
        assert [[t[k] for k in keys] for t in a] == [[t[k] for k in keys] for t in b]
        heads = [[[c["token"] for c in h] for h in t["head_topk"]] for t in a]
        assert heads == [[[c["token"] for c in h] for h in t["head_topk"]] for t in b]
    # an AR trace of the target alone (its own graph: no heads in the step)
    a = eager.generate(p, 40, mode="ar", trace=True, trace_heads=False).traces
    b = eng.generate(p, 40, mode="ar", trace=True, trace_heads=False).traces
    keys = ("accepted_tokens", "node_tokens", "target_argmax")
    assert [[t[k] for k in keys] for t in a] == [[t[k] for k in keys] for t in b]
    assert not any("head_topk" in t for t in a + b)


@QUICK
def test_traced_ar_heads_passes_replayed_from_a_graph_equal_eager_ones(eager):
    """On graphs a traced AR run's heads passes (16 steps, and the last, partial one) replay one captured graph
    per batch size (engine/head_trace.py, PassGraphs), which reads a ring kept from run to run: a batch whose
    requests leave at different steps records the eager run's heads' top-k at every step, and so do
    a second run and a run after a stream closed with steps still waiting for their pass."""
    eng = engine.load("demo", device="cuda", dtype="float32", backend="triton")
    batch = heldout_prompts(3)
    full = [eager.generate(p, 70, mode="ar", stop_on_eos=False).token_ids for p in batch]
    stop = full[0][len(full[0]) // 2]  # ends request 0 midway, the others wherever it occurs
    saved = eager.eos_ids
    eager.eos_ids, eng.eos_ids = {stop}, {stop}

    def heads_of(runs):
        return [[[[(c["token"], c["prob"]) for c in h] for h in t["head_topk"]] for t in r.traces] for r in runs]

    def assert_same(got, want):
        ids = [[[[c[0] for c in h] for h in s] for s in r] for r in got]
        assert ids == [[[[c[0] for c in h] for h in s] for s in r] for r in want]
        assert max(abs(a[1] - b[1]) for g, w in zip(got, want) for gs, ws in zip(g, w)
                   for gh, wh in zip(gs, ws) for a, b in zip(gh, wh)) <= 1e-5  # float32 GEMMs of 1 and 48 rows

    try:
        want = heads_of(eager.generate(batch, 70, mode="ar", trace=True))
        assert len({len(w) for w in want}) > 1 and max(map(len, want)) > 32  # several full passes, and a partial one
        for _ in range(2):
            assert_same(heads_of(eng.generate(batch, 70, mode="ar", trace=True)), want)
            assert eng.head_passes.captures == 1  # one batch size: captured once, replayed since
        for i, _ in enumerate(eng.stream(batch[1], 70, mode="ar", trace=True)):
            if i == 20:  # closed with steps still waiting for their pass
                break
        assert_same(heads_of([eng.generate(batch[2], 70, mode="ar", trace=True)]),
                    heads_of([eager.generate(batch[2], 70, mode="ar", trace=True)]))
    finally:
        eager.eos_ids = eng.eos_ids = saved


@QUICK
@pytest.mark.skipif(not torch.cuda.is_available() or not pdl.HAS_GDC or torch.cuda.get_device_capability()[0] < 9,
                    reason="programmatic dependent launch needs compute capability 9.0 and Triton 3.4")
@pytest.mark.parametrize("gemm", ["cublas", "skinny"])
def test_dependent_launch_changes_no_bit_of_a_graphed_run(monkeypatch, gemm):
    """PDL (engine/kernels/pdl.py) changes when a kernel starts, never what it computes: graphed greedy
    Medusa and AR in bf16 give the same tokens and leave the same KV cache, bit for bit, with it on and off.
    A kernel that read its predecessor's output before waiting for it would differ (when the race shows).
    `skinny` puts our GEMM, whose split-K counters carry from launch to launch, between the other kernels."""
    runs = {}
    for off in (False, True):
        monkeypatch.setattr(pdl, "disabled", off)
        assert pdl.enabled(torch.device("cuda")) != off
        eng = engine.load("demo", device="cuda", dtype="bfloat16", backend="triton", gemm=gemm)
        tokens = [eng.generate(p, 128, mode=mode, tree="mc_sim_7b_63", stop_on_eos=False).token_ids
                  for p in heldout_prompts(3) for mode in ("medusa", "ar")]
        runs[off] = tokens, eng.model.cache.k.clone(), eng.model.cache.v.clone()
    assert runs[False][0] == runs[True][0]
    assert torch.equal(runs[False][1], runs[True][1]) and torch.equal(runs[False][2], runs[True][2])


def test_non_greedy_rules_run_eagerly_with_graphs_on():
    eng = engine.load("demo", device="cuda", dtype="float32", backend="triton")
    ref = engine.load("demo", device="cuda", dtype="float32", backend="triton", cuda_graphs=False)
    p = heldout_prompts(1)[0]
    for accept in ("typical", "sample"):
        kw = dict(mode="medusa", tree="demo_tuned", accept=accept, temperature=0.8, seed=3)
        assert eng.generate(p, 32, **kw).token_ids == ref.generate(p, 32, **kw).token_ids
    assert eng.graphs.captures == 0


@pytest.mark.parametrize("n_kv", [4, 1])
def test_graphed_random_weight_model_equals_eager_ar(tmp_path, n_kv):
    make_hf_model(tmp_path, "llama", n_kv=n_kv, ctx=512)
    heads = random_heads_sd()
    ref = engine.load(tmp_path, heads=heads, device="cuda", dtype="float32", cuda_graphs=False)
    eng = engine.load(tmp_path, heads=heads, device="cuda", dtype="float32", backend="triton")
    prompts = [[1, 5, 9], list(range(3, 60)), [7] * 11]
    want = [ref.generate(p, 100, mode="ar", stop_on_eos=False).token_ids for p in prompts]
    for tree in ("mc_sim_7b_63", [[0], [1], [0, 0], [0, 1], [0, 0, 0]]):
        got = [eng.generate(p, 100, mode="medusa", tree=tree, stop_on_eos=False).token_ids for p in prompts]
        assert got == want
    batched = eng.generate(prompts, 100, mode="medusa", tree="mc_sim_7b_63", stop_on_eos=False)
    assert [r.token_ids for r in batched] == want


@QUICK
def test_graphed_oracle_long_paths_equal_ar(tmp_path):
    """Oracle drafts (tests/conftest.py): full-depth paths through non-first children, every step, in
    graphs with the fused kernels, batched too."""
    from conftest import oracle_heads, oracle_steps

    make_hf_model(tmp_path, "llama", n_kv=2, ctx=512)
    eng = engine.load(tmp_path, heads=random_heads_sd(), device="cuda", dtype="float32")
    prompts = [[1, 5, 9], list(range(3, 40))]
    rank = lambda p, k: (p + 2 * k) % 3  # noqa: E731
    eng.heads = oracle_heads(eng, prompts, 90, 5, rank)
    want = [eng.generate(p, 90, mode="ar").token_ids for p in prompts]
    for tree in ("mc_sim_7b_63", trees.kary(3, 4)):
        for p, w in zip(prompts, want):
            r = eng.generate(p, 90, mode="medusa", tree=tree)
            assert r.token_ids == w and r.steps == oracle_steps(trees.resolve(tree), 90, 5, rank)
        assert [r.token_ids for r in eng.generate(prompts, 90, mode="medusa", tree=tree)] == want
    assert eng.graphs.captures > 0


def test_traced_graphs_run_at_engine_speed_shape_and_equal_eager_traces(eager):
    """Traces are gathered inside the graph (one copy per step) and may be queued ahead: the same
    records as an eager traced run, in one replay per step."""
    eng = engine.load("demo", device="cuda", dtype="float32", backend="triton")
    p = heldout_prompts(1)[0]
    keys = ("accepted_tokens", "accepted_nodes", "node_tokens", "target_argmax", "accept_prob", "parent", "depth")
    for mode in ("ar", "medusa"):
        a = eager.generate(p, 60, mode=mode, tree="mc_sim_7b_63", trace=True).traces
        b = eng.generate(p, 60, mode=mode, tree="mc_sim_7b_63", trace=True).traces
        assert [[t[k] for k in keys if k in t] for t in a] == [[t[k] for k in keys if k in t] for t in b]
        assert [[[c["token"] for c in h] for h in t["head_topk"]] for t in a] == \
            [[[c["token"] for c in h] for h in t["head_topk"]] for t in b]


def test_sdpa_graphs_are_captured_per_span_bucket():
    """With sdpa a captured step reads a bounded span (SDPA reads every slot it is given): a long run
    crosses buckets, captures a graph per bucket, and still equals eager AR."""
    from engine.graphs import SDPA_BUCKET

    eng = engine.load("demo", device="cuda", dtype="float32", backend="sdpa")
    ref = engine.load("demo", device="cuda", dtype="float32", backend="sdpa", cuda_graphs=False)
    p = heldout_prompts(1)[0]
    want = ref.generate(p, 700, mode="ar", stop_on_eos=False).token_ids
    assert eng.generate(p, 700, mode="medusa", tree="demo_tuned", stop_on_eos=False).token_ids == want
    spans = {key[-1] for key in eng.graphs.graphs}
    assert len(spans) >= 2 and all(s % SDPA_BUCKET == 0 or s == eng.model.cache.capacity for s in spans)


@QUICK
def test_queued_steps_with_requests_finishing_at_different_steps(eager):
    """Steps are queued ahead of the host's read (graphs.STEPS_AHEAD): a request that stops (EOS)
    while later steps are in flight gets none of their tokens, the others keep theirs, and a
    stream the caller abandons leaves the engine consistent."""
    eng = engine.load("demo", device="cuda", dtype="float32", backend="triton")
    batch = heldout_prompts(4)
    full = [eager.generate(p, 80, mode="ar", stop_on_eos=False).token_ids for p in batch]
    stop = full[0][len(full[0]) // 3]  # a token that ends request 0 early, the others wherever it occurs
    saved = eager.eos_ids
    eager.eos_ids, eng.eos_ids = {stop}, {stop}
    try:
        want = [eager.generate(p, 80, mode="ar").token_ids for p in batch]
        assert len({len(w) for w in want}) > 1  # the requests really finish at different steps
        for mode, tree in (("ar", None), ("medusa", "mc_sim_7b_63"), ("medusa", "demo_tuned")):
            assert [r.token_ids for r in eng.generate(batch, 80, mode=mode, tree=tree)] == want
            assert [eng.generate(p, 80, mode=mode, tree=tree).token_ids for p in batch] == want
    finally:
        eager.eos_ids = eng.eos_ids = saved
    for i, _ in enumerate(eng.stream(batch[1], 80, mode="medusa", tree="mc_sim_7b_63")):
        if i == 3:
            break
    assert eng.generate(batch[2], 80, mode="medusa", tree="mc_sim_7b_63").token_ids == \
        eager.generate(batch[2], 80, mode="ar").token_ids


def test_a_graph_is_captured_per_heads_object(tmp_path):
    """The same tree, batch, span and tracing with other heads (oracle drafts after random ones) must
    not replay the graph captured with the first heads: it would draft from their weights."""
    from conftest import oracle_heads, oracle_steps

    make_hf_model(tmp_path, "llama", n_kv=2, ctx=512)
    eng = engine.load(tmp_path, heads=random_heads_sd(), device="cuda", dtype="float32", backend="triton")
    p, tree = [1, 5, 9], "mc_sim_7b_63"
    rank = lambda p, k: (p + 2 * k) % 3  # noqa: E731
    oracle = oracle_heads(eng, [p], 90, 5, rank)
    want = eng.generate(p, 90, mode="ar").token_ids
    first = eng.generate(p, 90, mode="medusa", tree=tree)  # captured with the random heads
    captured = eng.graphs.captures
    eng.heads = oracle
    second = eng.generate(p, 90, mode="medusa", tree=tree)
    assert first.token_ids == second.token_ids == want
    assert second.steps == oracle_steps(trees.resolve(tree), 90, 5, rank) < first.steps
    assert eng.graphs.captures == captured + 1
