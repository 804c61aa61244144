"""Parity: our decoder vs transformers, Medusa vs AR, and the KV cache after a tree step."""

import pytest
import torch
from conftest import VOCAB, make_hf_model, random_heads_sd

import engine
import trees

LAYOUTS = [("llama", 2, False), ("llama", 4, True), ("mistral", 1, False), ("qwen2", 2, True)]


@pytest.fixture(scope="module", params=LAYOUTS, ids=lambda p: f"{p[0]}-kv{p[1]}-{'tied' if p[2] else 'untied'}")
def model_pair(request, tmp_path_factory):
    kind, n_kv, tied = request.param
    d = tmp_path_factory.mktemp(kind)
    hf = make_hf_model(d, kind, n_kv=n_kv, tied=tied)
    eng = engine.load(d, heads=random_heads_sd(), device="cpu", dtype="float32")
    return hf, eng


def prompt(seed, n=9):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_logits_match_transformers(model_pair):
    hf, eng = model_pair
    ids = prompt(3, 20)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
        eng.model.setup_cache(1, 64)
        ours = eng.model.lm_head(eng.model(torch.tensor([ids]), torch.arange(20)))[0]
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("seed", [0, 1])
def test_ar_greedy_equals_transformers_generate(model_pair, seed):
    hf, eng = model_pair
    ids = prompt(seed)
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=40, min_new_tokens=40, do_sample=False)[0, len(ids):]
    assert eng.generate(ids, 40, mode="ar").token_ids == ref.tolist()


def random_prefix_closed(seed, n=20, topk=10, depth=5):
    g = torch.Generator().manual_seed(seed)
    paths = []
    while len(paths) < n:
        options = [[]] + paths
        parent = options[int(torch.randint(0, len(options), (1,), generator=g))]
        if len(parent) < depth:
            child = parent + [int(torch.randint(0, topk, (1,), generator=g))]
            if child not in paths:
                paths.append(child)
    return paths


TREES = ["chain_1", "chain_5", [[r] for r in range(10)], "mc_sim_7b_63", random_prefix_closed(0), random_prefix_closed(1)]


@pytest.mark.parametrize("tree", TREES, ids=["chain1", "chain5", "wide", "mc_sim", "rand0", "rand1"])
def test_medusa_greedy_equals_ar(model_pair, tree):
    _, eng = model_pair
    for seed in (0, 5):
        ids = prompt(seed)
        ar = eng.generate(ids, 48, mode="ar")
        md = eng.generate(ids, 48, mode="medusa", tree=tree)
        assert md.token_ids == ar.token_ids
        assert md.steps <= ar.steps


def test_near_cache_limit_and_eos_inside_accepted_path(tmp_path):
    make_hf_model(tmp_path, "llama", n_kv=2, ctx=64)
    eng = engine.load(tmp_path, heads=random_heads_sd(), device="cpu")
    ids = prompt(2, 30)
    ar = eng.generate(ids, 34, mode="ar")  # 30 + 34 = the whole 64-token context
    md = eng.generate(ids, 34, mode="medusa", tree="mc_sim_7b_63")
    assert md.token_ids == ar.token_ids and len(md.token_ids) == 34
    with pytest.raises(engine.GenerationError, match="exceeds the context of 64"):
        eng.generate(ids, 35, mode="ar")
    # EOS: make a token from the middle of the greedy output the EOS id
    eos = ar.token_ids[10]
    first = ar.token_ids.index(eos)
    eng.eos_ids = {eos}
    for mode in ("ar", "medusa"):
        r = eng.generate(ids, 34, mode=mode, tree="mc_sim_7b_63")
        assert r.token_ids == ar.token_ids[: first + 1] and r.finish_reason == "eos"


def test_kv_cache_after_tree_step_equals_recomputation(model_pair):
    _, eng = model_pair
    ids = prompt(4, 12)
    res = eng.generate(ids, 30, mode="medusa", tree="mc_sim_7b_63")
    committed = ids + res.token_ids[:-1]  # the last token's K/V is not computed yet
    n = len(committed)
    k_after = eng.model.cache.k[:, :, :, :n].clone()
    v_after = eng.model.cache.v[:, :, :, :n].clone()
    eng.model.setup_cache(1, 256)
    with torch.no_grad():
        eng.model(torch.tensor([committed]), torch.arange(n))
    torch.testing.assert_close(k_after, eng.model.cache.k[:, :, :, :n], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(v_after, eng.model.cache.v[:, :, :, :n], atol=1e-5, rtol=1e-4)


def test_typical_and_sample_modes_run_and_sample_at_zero_temperature_is_greedy(model_pair):
    _, eng = model_pair
    ids = prompt(7)
    ar = eng.generate(ids, 30, mode="ar")
    assert eng.generate(ids, 30, mode="medusa", tree="mc_sim_7b_63", accept="sample", temperature=0.0).token_ids == ar.token_ids
    assert eng.generate(ids, 30, mode="ar", accept="sample", temperature=0.0).token_ids == ar.token_ids
    a = eng.generate(ids, 30, mode="medusa", accept="typical", temperature=0.8, seed=3)
    b = eng.generate(ids, 30, mode="medusa", accept="typical", temperature=0.8, seed=3)
    assert a.token_ids == b.token_ids and a.new_tokens == 30


def test_trace_records_the_step(model_pair, tmp_path):
    _, eng = model_pair
    f = tmp_path / "t.jsonl"
    res = eng.generate(prompt(1), 20, mode="medusa", tree="chain_3", trace=True, trace_file=f)
    rows = trees.read_traces(f)
    assert rows[0]["type"] == "header" and len(rows) == 1 + res.steps
    s = rows[1]
    assert s["tree"] == [[0], [0, 0], [0, 0, 0]] and len(s["node_tokens"]) == 4
    assert s["accepted_nodes"][0] == 0 and len(s["head_topk"]) == 5 and len(s["head_topk"][0]) == 10
    assert sum(len(r["accepted_tokens"]) for r in rows[1:]) == 20
    vec = trees.rank_vectors_from_file(f)
    # the empirical estimate of the tree that ran equals what it actually accepted (greedy)
    assert trees.expected_empirical([[0], [0, 0], [0, 0, 0]], vec[:-3]) == pytest.approx(
        sum(len(r["accepted_tokens"]) for r in rows[1:-3]) / (res.steps - 3))


def test_cuda_graphs_on_a_cpu_engine_is_a_clear_error(llama_dir):
    with pytest.raises(engine.ModelLoadError, match="cuda_graphs needs a CUDA device"):
        engine.load(llama_dir, device="cpu", cuda_graphs=True)
    assert engine.load(llama_dir, device="cpu").graphs is None  # default: off without CUDA


def test_fused_projections_keep_logits_and_greedy_output(tmp_path):
    """Stacking q/k/v and gate/up into one GEMM each (done with CUDA graphs) changes no result."""
    make_hf_model(tmp_path, "qwen2", n_kv=2)  # biased q/k/v: the stacked bias must line up too
    eng = engine.load(tmp_path, heads=random_heads_sd(), device="cpu", dtype="float32")
    ids = prompt(5, 20)

    def logits():
        with torch.no_grad():
            eng.model.setup_cache(1, 64)
            return eng.model.lm_head(eng.model(torch.tensor([ids]), torch.arange(20)))[0]

    before, want = logits(), eng.generate(ids, 40, mode="medusa", tree="mc_sim_7b_63").token_ids
    eng.model.fuse_projections()
    attn, mlp = eng.model.layers[0].self_attn, eng.model.layers[0].mlp
    assert attn.qkv_proj is not None and not hasattr(attn, "q_proj") and not hasattr(mlp, "up_proj")
    torch.testing.assert_close(logits(), before, atol=1e-5, rtol=1e-5)
    assert eng.generate(ids, 40, mode="medusa", tree="mc_sim_7b_63").token_ids == want


def test_compaction_reference_gathers_before_writing():
    """Slots move even when a destination is another move's source (ranges overlap)."""
    from engine.model import compact_reference

    k = torch.arange(2 * 1 * 1 * 8 * 2, dtype=torch.float32).view(2, 1, 1, 8, 2)
    v = -k
    src = torch.tensor([[0, 2, 3, 5, 5]])  # padded by repeating the last pair
    dst = torch.tensor([[0, 1, 2, 3, 3]])
    before = k.clone()
    compact_reference(k, v, src, dst)
    assert torch.equal(k[:, 0, 0, :4], before[:, 0, 0, [0, 2, 3, 5]])
    assert torch.equal(v, -k) and torch.equal(k[:, 0, 0, 4:], before[:, 0, 0, 4:])
