"""Parity: our decoder vs transformers, Medusa vs AR with drafts that are really accepted (oracle
heads), the KV cache after long accepted paths, and the generation API's contract."""

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import VOCAB, make_hf_model, oracle_heads, oracle_steps, random_heads_sd

import engine
import trees
from trees.estimate import step_start_values

LAYOUTS = [("llama", 4, False), ("llama", 2, False), ("llama", 4, True), ("mistral", 1, False), ("qwen2", 2, True)]
MAX_NEW = 40


@pytest.fixture(scope="module", params=LAYOUTS, ids=lambda p: f"{p[0]}-kv{p[1]}-{'tied' if p[2] else 'untied'}")
def model_pair(request, tmp_path_factory):
    kind, n_kv, tied = request.param
    d = tmp_path_factory.mktemp(kind)
    hf = make_hf_model(d, kind, n_kv=n_kv, tied=tied)
    eng = engine.load(d, heads=random_heads_sd(), device="cpu", dtype="float32")
    return hf, eng


def prompt(seed, n=9):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def hf_greedy(hf, ids, n):
    with torch.no_grad():
        return hf.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, len(ids):].tolist()


def test_logits_match_transformers(model_pair):
    hf, eng = model_pair
    ids = prompt(3, 20)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
        eng.model.setup_cache(1, 64)
        ours = eng.model.lm_head(eng.model(torch.tensor([ids]), torch.arange(20)))[0]
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


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


TREES = {"chain1": "chain_1", "chain5": "chain_5", "wide": [[r] for r in range(10)], "mc_sim": "mc_sim_7b_63",
         "rand0": random_prefix_closed(0), "rand1": random_prefix_closed(1, n=60), "kary3x4": trees.kary(3, 4)}
RANKS = {"top1": lambda p, k: 0, "mixed": lambda p, k: (p + 2 * k) % 3}  # mixed: ranks 0-2, so non-first children


@pytest.fixture(scope="module")
def oracle_runs(model_pair):
    """Per layout: the prompts, AR and transformers outputs, and oracle heads of each rank pattern."""
    hf, eng = model_pair
    prompts = [prompt(0), prompt(5, 13)]
    ar = [eng.generate(p, MAX_NEW, mode="ar").token_ids for p in prompts]
    ref = [hf_greedy(hf, p, MAX_NEW) for p in prompts]
    oracles = {name: oracle_heads(eng, prompts, MAX_NEW, 5, rank) for name, rank in RANKS.items()}
    return eng, prompts, ar, ref, oracles


@pytest.mark.parametrize("ranks", list(RANKS))
@pytest.mark.parametrize("tree", list(TREES))
def test_oracle_medusa_equals_ar_and_transformers_with_long_paths(oracle_runs, tree, ranks):
    """Drafts that are right (at rank 0, or at ranks 0-2): full-depth and non-first-child paths are
    accepted and compacted on every step, and the output is still AR's and transformers'. The step
    count is exactly what the tree must take under these drafts (conftest.oracle_steps)."""
    eng, prompts, ar, ref, oracles = oracle_runs
    saved, eng.heads = eng.heads, oracles[ranks]
    try:
        choices = trees.resolve(TREES[tree])
        for p, want_ar, want_hf in zip(prompts, ar, ref):
            md = eng.generate(p, MAX_NEW, mode="medusa", tree=choices)
            assert want_ar == want_hf
            assert md.token_ids == want_ar
            assert md.steps == oracle_steps(choices, MAX_NEW, 5, RANKS[ranks])
            if ranks == "top1":  # every step keeps the tree's whole top-1 chain (but at the very end)
                depth = max(d for d in range(6) if all([0] * i in choices for i in range(1, d + 1)))
                assert md.steps == -(-MAX_NEW // (depth + 1))
        batch = eng.generate(prompts, MAX_NEW, mode="medusa", tree=choices)  # batched: the same, row by row
        assert [r.token_ids for r in batch] == ar
    finally:
        eng.heads = saved


def test_kv_cache_after_long_accepted_paths_equals_recomputation(oracle_runs):
    eng, prompts, ar, _, oracles = oracle_runs
    saved, eng.heads = eng.heads, oracles["mixed"]
    try:
        ids = prompts[1]
        res = eng.generate(ids, MAX_NEW, mode="medusa", tree="mc_sim_7b_63")
        assert res.mean_accepted > 2.0  # long paths through non-first children were compacted
        committed = ids + res.token_ids[:-1]  # the last token's K/V is not computed yet
        n = len(committed)
        k_after = eng.model.cache.k[:, :1, :, :n].clone()
        v_after = eng.model.cache.v[:, :1, :, :n].clone()
        eng.model.cache = None
        eng.model.setup_cache(1, 256)
        with torch.no_grad():
            eng.model(torch.tensor([committed]), torch.arange(n))
        torch.testing.assert_close(k_after, eng.model.cache.k[:, :1, :, :n], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(v_after, eng.model.cache.v[:, :1, :, :n], atol=1e-5, rtol=1e-4)
    finally:
        eng.heads = saved


def test_near_cache_limit_and_eos_inside_accepted_path(tmp_path):
    make_hf_model(tmp_path, "llama", n_kv=2, ctx=64)
    eng = engine.load(tmp_path, heads=random_heads_sd(), device="cpu")
    ids = prompt(2, 30)
    ar = eng.generate(ids, 34, mode="ar")  # 30 + 34 = the whole 64-token context
    eng.heads = oracle_heads(eng, [ids], 34, 5)
    md = eng.generate(ids, 34, mode="medusa", tree="mc_sim_7b_63")
    assert md.token_ids == ar.token_ids and len(md.token_ids) == 34 and md.mean_accepted > 4
    with pytest.raises(engine.GenerationError, match="exceeds the context of 64"):
        eng.generate(ids, 35, mode="ar")
    # EOS: a token from the middle of the greedy output, reached inside an accepted path
    eos = ar.token_ids[10]
    first = ar.token_ids.index(eos)
    eng.eos_ids = {eos}
    for mode in ("ar", "medusa"):
        r = eng.generate(ids, 34, mode=mode, tree="mc_sim_7b_63")
        assert r.token_ids == ar.token_ids[: first + 1] and r.finish_reason == "eos"


def test_sampling_rules_at_zero_temperature_are_greedy_and_seeds_repeat(model_pair):
    _, eng = model_pair
    ids = prompt(7)
    ar = eng.generate(ids, 30, mode="ar")
    assert eng.generate(ids, 30, mode="medusa", tree="mc_sim_7b_63", accept="sample", temperature=0.0).token_ids == ar.token_ids
    assert eng.generate(ids, 30, mode="ar", accept="sample", temperature=0.0).token_ids == ar.token_ids
    a = eng.generate(ids, 30, mode="medusa", accept="typical", temperature=0.8, seed=3)
    b = eng.generate(ids, 30, mode="medusa", accept="typical", temperature=0.8, seed=3)
    assert a.token_ids == b.token_ids and a.new_tokens == 30
    draws = {tuple(eng.generate(ids, 12, mode="ar", accept="sample", temperature=1.5, seed=s).token_ids) for s in range(4)}
    assert len(draws) > 1  # different seeds sample different texts


def test_typical_runs_are_deterministic_without_a_seed_and_start_with_greedys_token(model_pair):
    """Medusa's typical acceptance keeps every root greedy, the first one included: two unseeded runs at
    T = 1.5 agree, their first token is greedy's, and typical AR is greedy AR. (A first token sampled at
    T = 1.5 from this random model differs between runs or from greedy on some of 8 prompts.)"""
    _, eng = model_pair
    for s in range(8):
        ids = prompt(100 + s)
        runs = [eng.generate(ids, 10, mode="medusa", tree="mc_sim_7b_63", accept="typical", temperature=1.5).token_ids
                for _ in range(2)]
        greedy = eng.generate(ids, 10, mode="ar").token_ids
        assert runs[0] == runs[1] and runs[0][0] == greedy[0], s
        assert eng.generate(ids, 10, mode="ar", accept="typical", temperature=1.5).token_ids == greedy


def test_typical_traces_record_the_rule_so_step_start_equals_what_each_step_kept(model_pair, tmp_path):
    """Under top-k and top-p the typical rule still judges by softmax(logits / T) (Medusa's); the traced
    accept_prob must be that rule's, so the step-start estimator on the run's own tree gives exactly
    each step's kept count."""
    _, eng = model_pair
    f = tmp_path / "typical.jsonl"
    for s, (top_k, top_p) in enumerate([(3, 1.0), (0, 0.5), (5, 0.8)]):
        eng.generate(prompt(200 + s), 30, mode="medusa", tree="mc_sim_7b_63", accept="typical", temperature=0.9,
                     top_k=top_k, top_p=top_p, trace_file=str(f))
    runs = trees.read_runs(f)
    assert len(runs) == 3 and all(r.acceptance == "typical" for r in runs)
    for r in runs:
        assert step_start_values(r.tree, r) == [float(a) for a in r.accepted]
    assert any(a > 1 for r in runs for a in r.accepted)  # some steps kept drafted nodes


def test_trace_records_the_step_with_parent_and_depth(model_pair, tmp_path):
    _, eng = model_pair
    f = tmp_path / "t.jsonl"
    res = eng.generate(prompt(1), 20, mode="medusa", tree="chain_3", trace=True, trace_file=str(f))
    runs = trees.read_runs(f)
    assert len(runs) == 1 and runs[0].n_steps == res.steps and runs[0].n_tokens == 20
    s = res.traces[0]
    assert s["tree"] == [[0], [0, 0], [0, 0, 0]] and s["parent"] == [-1, 0, 1, 2] and s["depth"] == [0, 1, 2, 3]
    assert len(s["node_tokens"]) == 4 and s["node_tokens"][0] == res.token_ids[0]
    assert s["accepted_nodes"][0] == 0 and len(s["head_topk"]) == 5 and len(s["head_topk"][0]) == 10
    assert s["target_prob"][0] is None and all(0 <= p <= 1 for p in s["target_prob"][1:])
    # greedy: a node is kept iff it is the target's argmax at its parent
    for t in res.traces:
        for node, (tok, par) in enumerate(zip(t["node_tokens"], t["parent"])):
            if par >= 0:
                assert t["accept_prob"][node] == float(tok == t["target_argmax"][par])
    assert sum(len(t["accepted_tokens"]) for t in res.traces) == 20


def test_an_ar_trace_runs_the_heads_only_when_their_top_k_is_asked_for(model_pair, monkeypatch, tmp_path):
    """trace_heads=False: the target's trace alone, from the untraced AR step's work (the heads never
    run); the default records each head's top-k, which runs them. Tokens are the same either way."""
    _, eng = model_pair
    calls = []
    forward = type(eng.heads).forward
    monkeypatch.setattr(type(eng.heads), "forward", lambda self, *a, **k: calls.append(1) or forward(self, *a, **k))
    plain = eng.generate(prompt(1), 12, mode="ar")
    assert calls == []
    target_only = eng.generate(prompt(1), 12, mode="ar", trace_heads=False, trace_file=str(tmp_path / "t.jsonl"))
    assert calls == [] and target_only.token_ids == plain.token_ids
    assert json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])["trace_heads"] is False
    assert all("head_topk" not in t and t["node_tokens"] == t["accepted_tokens"][:1] for t in target_only.traces)
    with_heads = eng.generate(prompt(1), 12, mode="ar", trace=True)
    assert calls and with_heads.token_ids == plain.token_ids
    assert all(len(t["head_topk"]) == eng.num_heads for t in with_heads.traces)
    def target_fields(traces):
        return [{k: v for k, v in t.items() if k not in ("head_topk", "step_ms")} for t in traces]

    assert target_fields(with_heads.traces) == target_fields(target_only.traces)


def heads_topk_at(eng, ids: list[int], topk: int) -> list[list[list[tuple[int, float]]]]:
    """Per position of `ids`: each head's top-k (token, probability) from one forward over all of it."""
    with torch.inference_mode():
        hidden = eng.model(torch.tensor([ids]), torch.arange(len(ids)), start=0)[0]  # [n, d]
        logits = eng.heads(hidden, eng.model.lm_head.weight).transpose(0, 1).float()  # [n, K, V]
        vals, tok = logits.topk(topk, dim=-1)
        probs = (vals - logits.logsumexp(-1, keepdim=True)).exp()
    return [[list(zip(t, p)) for t, p in zip(tt.tolist(), pp.tolist())] for tt, pp in zip(tok, probs)]


@pytest.mark.parametrize("every", [1, 4])
def test_an_ar_trace_gets_each_steps_head_top_k_from_the_hidden_state_before_it(model_pair, monkeypatch, tmp_path,
                                                                                 every):
    """engine/head_trace.py: the heads run outside the steps, `every` steps at once (the engine's
    choice is 1 eagerly, 16 on CUDA graphs). Step s of a request records the heads' top-k at the
    token before it (the prompt's last for step 0), whichever batch of steps it was filled in, with
    requests leaving the batch at different steps; the trace file holds the same lines in order."""
    from engine.head_trace import HeadTrace

    _, eng = model_pair
    monkeypatch.setattr(engine.engine, "HeadTrace", lambda heads, w, topk, _every, batch, _graphs, ahead:
                        HeadTrace(heads, w, topk, every, batch, ahead=ahead))
    prompts = [prompt(5), prompt(6, 4), prompt(7, 14)]
    plain = eng.generate(prompts, 15, mode="ar", stop_on_eos=False)
    # an end-of-sequence token that makes requests leave the batch at different steps, where the
    # random model's outputs allow one (a tied layout may repeat one token everywhere)
    def lengths_if_eos(tok):
        return [r.token_ids.index(tok) + 1 if tok in r.token_ids else 15 for r in plain]

    leaving = [tok for r in plain for tok in r.token_ids if len(set(lengths_if_eos(tok))) > 1]
    eos = max(leaving, key=lambda tok: min(lengths_if_eos(tok)), default=None)  # the latest first exit
    if eos is not None:
        monkeypatch.setattr(eng, "eos_ids", {eos})
    f = tmp_path / "t.jsonl"
    runs = eng.generate(prompts, 15, mode="ar", trace=True, trace_file=str(f))
    assert [r.new_tokens for r in runs] == (lengths_if_eos(eos) if eos is not None else [15] * 3)
    lines = [json.loads(line) for line in f.read_text().splitlines()[1:]]
    assert sorted(lines, key=lambda t: (t["request"], t["step"])) == \
        [json.loads(json.dumps(t)) for r in runs for t in r.traces]
    assert [t["step"] for t in lines] == sorted(t["step"] for t in lines)
    for p, r in zip(prompts, runs):
        want = heads_topk_at(eng, p + r.token_ids, eng.topk)
        assert len(r.traces) == r.steps == r.new_tokens
        for s, t in enumerate(r.traces):
            got = [[(c["token"], c["prob"]) for c in h] for h in t["head_topk"]]
            ref = want[len(p) + s - 1]
            assert [[c[0] for c in h] for h in got] == [[c[0] for c in h] for h in ref], (s, every)
            assert max(abs(a[1] - b[1]) for g, w in zip(got, ref) for a, b in zip(g, w)) <= 2e-6


def test_a_medusa_trace_records_the_top_k_each_step_drafted_from(model_pair):
    """A tree step's head fields as finish_step reads them: step s drafted from the heads at the last
    token committed before it (position prefix_len - 1 of the whole sequence)."""
    _, eng = model_pair
    p = prompt(8)
    r = eng.generate(p, 30, mode="medusa", tree="mc_sim_7b_63", trace=True, stop_on_eos=False)
    want = heads_topk_at(eng, p + r.token_ids, eng.topk)
    assert len(r.traces) == r.steps > 1
    for t in r.traces:
        ref = want[t["prefix_len"] - 1]
        got = [[(c["token"], c["prob"]) for c in h] for h in t["head_topk"]]
        assert [[c[0] for c in h] for h in got] == [[c[0] for c in h] for h in ref], t["step"]
        assert max(abs(a[1] - b[1]) for g, w in zip(got, ref) for a, b in zip(g, w)) <= 2e-6


def documented_step_fields() -> set[str]:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "trace-schema.md").read_text()
    table = doc.split("## Step", 1)[1]
    return {name for line in table.splitlines() if line.startswith("| `") for name in re.findall(r"`(\w+)`", line.split("|")[1])}


def test_a_step_is_one_record_from_stream_to_file_with_the_documented_fields(model_pair, tmp_path):
    """The streamed StepEvent's trace is its to_json(), the file holds that same line, and its keys are
    exactly the fields docs/trace-schema.md lists (`request` only in a batch)."""
    _, eng = model_pair
    fields = documented_step_fields()
    assert {"step", "accepted_tokens", "accept_prob", "head_topk", "request"} <= fields
    f = tmp_path / "t.jsonl"
    events = list(eng.stream(prompt(3), 15, mode="medusa", tree="mc_sim_7b_63", trace=True, trace_file=str(f)))
    lines = [json.loads(line) for line in f.read_text().splitlines()[1:]]
    assert lines == [json.loads(json.dumps(e.to_json())) for e in events] == [json.loads(json.dumps(e.trace)) for e in events]
    assert all(set(line) == fields - {"request"} for line in lines)
    assert [t for line in lines for t in line["accepted_tokens"]] == [t for e in events for t in e.tokens]
    batch = eng.generate([prompt(3), prompt(4)], 10, mode="medusa", trace=True)
    assert all(set(t) == fields and t["request"] == i for i, r in enumerate(batch) for t in r.traces)
    assert list(eng.stream(prompt(3), 5))[0].trace is None  # untraced runs record no trace


def test_stream_pieces_join_to_generate_text_and_tokens(model_pair):
    _, eng = model_pair
    for mode in ("ar", "medusa"):
        events = list(eng.stream(prompt(2), 25, mode=mode, tree="mc_sim_7b_63"))
        res = eng.generate(prompt(2), 25, mode=mode, tree="mc_sim_7b_63")
        assert "".join(e.text for e in events) == res.text
        assert [t for e in events for t in e.tokens] == res.token_ids
        assert events[-1].done and events[-1].finish_reason == "length" and not any(e.done for e in events[:-1])


def test_generation_config_drives_the_api(model_pair):
    _, eng = model_pair
    cfg = engine.GenerationConfig(max_new_tokens=12, mode="medusa", tree="chain_2")
    a = eng.generate(prompt(4), config=cfg)
    b = eng.generate(prompt(4), 12, mode="medusa", tree="chain_2")
    assert a.token_ids == b.token_ids and a.tree == [[0], [0, 0]]
    assert eng.generate(prompt(4), config=cfg, max_new_tokens=5).new_tokens == 5  # keywords override the config
    for bad, msg in (({"mode": "x"}, "unknown mode"), ({"accept": "x"}, "unknown acceptance"),
                     ({"max_new_tokens": 0}, "positive integer"), ({"seed": 2**70}, "seed must be"),
                     ({"top_p": 0}, "top_p"), ({"nonsense": 1}, "unknown generation setting"),
                     ({"tree": []}, "tree is empty")):
        with pytest.raises(engine.GenerationError, match=msg):
            eng.generate(prompt(4), config=cfg, **bad)


def test_cuda_graphs_on_a_cpu_engine_is_a_clear_error(llama_dir):
    with pytest.raises(engine.ModelLoadError, match="cuda_graphs needs a CUDA device"):
        engine.load(llama_dir, device="cpu", cuda_graphs=True)
    assert engine.load(llama_dir, device="cpu").graphs is None  # default: off without CUDA


def test_stacked_projections_keep_logits_and_greedy_output(tmp_path):
    """Stacking q/k/v and gate/up into one GEMM each (done with CUDA graphs) changes no result."""
    make_hf_model(tmp_path, "qwen2", n_kv=2)  # biased q/k/v: the stacked bias must line up too
    eng = engine.load(tmp_path, heads=random_heads_sd(), device="cpu", dtype="float32")
    ids = prompt(5, 20)

    def logits():
        with torch.no_grad():
            eng.model.setup_cache(1, 64)
            return eng.model.lm_head(eng.model(torch.tensor([ids]), torch.arange(20)))[0]

    before, want = logits(), eng.generate(ids, 40, mode="medusa", tree="mc_sim_7b_63").token_ids
    eng.model.stack_projections()
    attn, mlp = eng.model.layers[0].self_attn, eng.model.layers[0].mlp
    assert attn.qkv_proj is not None and not hasattr(attn, "q_proj") and not hasattr(mlp, "up_proj")
    torch.testing.assert_close(logits(), before, atol=1e-5, rtol=1e-5)
    assert eng.generate(ids, 40, mode="medusa", tree="mc_sim_7b_63").token_ids == want


def test_compaction_reference_gathers_before_writing():
    """Slots move even when a destination is another move's source (ranges overlap)."""
    from engine.kernels.compact import compact_reference

    k = torch.arange(2 * 1 * 1 * 8 * 2, dtype=torch.float32).view(2, 1, 1, 8, 2)
    v = -k
    src = torch.tensor([[0, 2, 3, 5, 5]])  # padded by repeating the last pair
    dst = torch.tensor([[0, 1, 2, 3, 3]])
    before = k.clone()
    compact_reference(k, v, src, dst)
    assert torch.equal(k[:, 0, 0, :4], before[:, 0, 0, [0, 2, 3, 5]])
    assert torch.equal(v, -k) and torch.equal(k[:, 0, 0, 4:], before[:, 0, 0, 4:])


@pytest.mark.parametrize("sm", [78, 132])
def test_skinny_gemm_splits_fill_the_gpu_without_overflowing_the_workspace(sm):
    """The K splits the skinny GEMM's tuner may time give one to four programs per SM (or, where none does, the
    one nearest), and no split as well; none for N of 64 outputs per SM and more, which then get no workspace; the
    counters cover the column blocks of any N that may split, and the partials' workspace is sized from the same
    rule, so no timed config writes past it."""
    from engine.kernels.gemv import BLOCKS, MIN_BLOCK_N, SPLIT_BELOW, max_split, splits_for

    for n in (256, 1000, 4096, 11008, 12288, 22016, 32000, 152064, SPLIT_BELOW * sm - 1):
        assert (max_split(n, sm) == 1) == (n >= SPLIT_BELOW * sm)
        if max_split(n, sm) > 1:
            assert -(-n // MIN_BLOCK_N) <= SPLIT_BELOW * sm // MIN_BLOCK_N  # gemv.split_counters' size
        for bn, *_ in BLOCKS:
            blocks = -(-n // bn)
            splits = splits_for(n, bn, sm)
            assert splits and max(splits) <= max_split(n, sm)
            assert splits[0] == 1  # unsplit is always timed: at 64 rows it can beat every split
            if n >= SPLIT_BELOW * sm:
                assert splits == (1,)
            else:  # of 2-8, those that fill the GPU one to four times over, else the largest
                filling = tuple(s for s in (2, 4, 8) if sm <= blocks * s <= 4 * sm)
                assert splits[1:] == (filling or (8,))


@pytest.mark.parametrize("m_block", [16, 64])
def test_the_skinny_gemms_tuner_times_unsplit_and_split_configs(m_block):
    """Where K may split (the 7B o-projection, N 4096, on 132 SMs), the configs the tuner times after its prune
    include unsplit ones and split ones, each block shape with the splits `splits_for` allows it. The tuner's own
    config list where Triton is installed, else the same list built from BLOCKS x SPLITS."""
    from types import SimpleNamespace

    from engine.kernels import gemv

    if gemv.triton is not None:
        configs = gemv._skinny.configs
    else:
        configs = [SimpleNamespace(kwargs={"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": s}, num_stages=st)
                   for bn, bk, _, st in gemv.BLOCKS for s in gemv.SPLITS]
    kept = gemv._worth_timing(configs, {"N": 4096, "SM": 132}, M_BLOCK=m_block, GATED=False)
    splits = {c.kwargs["SPLIT_K"] for c in kept}
    assert 1 in splits and splits - {1}, splits
    assert all(c.kwargs["SPLIT_K"] in gemv.splits_for(4096, c.kwargs["BLOCK_N"], 132) for c in kept)
    assert {c.kwargs["BLOCK_N"] for c in kept if c.kwargs["SPLIT_K"] == 1} == {c.kwargs["BLOCK_N"] for c in kept}


def test_cache_is_sized_to_the_request_not_the_context(tmp_path):
    make_hf_model(tmp_path, "llama", n_kv=2, ctx=4096)
    eng = engine.load(tmp_path, heads=random_heads_sd(), device="cpu")
    eng.generate(prompt(1, 10), 20, mode="medusa", tree="mc_sim_7b_63")
    assert eng.model.cache.capacity == 256  # 10 + 20 + 64 nodes, rounded up to 256; the context is 4096
    eng.generate(prompt(1, 10), 600, mode="ar")
    assert eng.model.cache.capacity == 768


def test_a_trees_buffers_are_built_at_its_first_run_and_kept_per_tree(model_pair, monkeypatch):
    """Engine.tree_buffers: a tree's buffers are built once and reused by its later runs; another tree of as
    many nodes gets its own (each run still equals AR); at most TREES_KEPT trees are kept, the least recently
    used going first."""
    _, eng = model_pair
    eng._tree_buffers.clear()
    built = []
    build = trees.buffers
    monkeypatch.setattr(trees, "buffers", lambda choices, topk: built.append(choices) or build(choices, topk=topk))
    p = prompt(4)
    want = eng.generate(p, 24, mode="ar").token_ids
    wide, deep = [[0], [1], [2], [0, 0]], [[0], [1], [0, 0], [0, 0, 0]]  # four nodes each
    for tree in (wide, deep, wide, deep):
        assert eng.generate(p, 24, mode="medusa", tree=tree).token_ids == want
    assert built == [wide, deep]
    assert eng.tree_buffers(wide).paths != eng.tree_buffers(deep).paths and len(built) == 2
    others = [[[a], [a, b]] for a in range(10) for b in range(4)][: engine.engine.TREES_KEPT - 2]  # fills it
    for tree in others:
        eng.tree_buffers(tree)
    assert len(built) == 2 + len(others) and len(eng._tree_buffers) == engine.engine.TREES_KEPT
    eng.tree_buffers(wide)  # kept: `deep` was used before it, and goes at the next new tree
    eng.tree_buffers([[9], [9, 9]])
    assert len(built) == 3 + len(others) and len(eng._tree_buffers) == engine.engine.TREES_KEPT
    eng.tree_buffers(deep)
    assert built[-1] == deep  # built again


@pytest.mark.parametrize("mode,tree", [("ar", None), ("medusa", "mc_sim_7b_63")])
def test_every_head_candidate_in_a_trace_carries_its_own_tokens_text(model_pair, mode, tree):
    """StepEvent.to_json builds head_topk straight from the packed fields: each candidate's text is its
    token's (as node_text is for node_tokens), and each head's list is the event's head_topk."""
    _, eng = model_pair
    r = eng.generate(prompt(8), 12, mode=mode, tree=tree, trace=True, stop_on_eos=False)
    for t in r.traces:
        assert t["head_topk"] and all(len(h) == eng.topk for h in t["head_topk"])
        for h in t["head_topk"]:
            for c in h:
                assert c["text"] == eng._token_text[c["token"]], (t["step"], c)
