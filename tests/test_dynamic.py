"""Dynamic-tree replay (trees/dynamic.py) and paired comparisons (trees/compare.py): hand-worked walks,
brute force for the per-step tree, the collapse to the static replay, and the CLI that reaches them."""

import itertools
import json

import pytest
import torch
from conftest import ar_run, random_ar_runs, write_ar_trace

import trees
from engine.trace import prompt_hash
from trees.__main__ import main
from trees.dynamic import PRIOR_WEIGHT


def _key(path, factors):
    score = 1.0
    for k, r in enumerate(path):
        score *= factors[k][r]
    return -score, len(path), path


@pytest.mark.parametrize("seed", range(4))
def test_step_tree_is_the_n_best_paths_by_product(seed):
    """Brute force: every path up to the heads' depth, sorted by (-product, depth, path); the step's
    tree is the first n of them, for every n, and is always a tree (prefix-closed)."""
    g = torch.Generator().manual_seed(seed)
    factors = [torch.rand(3, generator=g).tolist() for _ in range(3)]
    factors[1][2] = 0.0  # a zero factor: its subtree ties at 0 and goes by (depth, path)
    universe = [p for d in range(1, 4) for p in itertools.product(range(3), repeat=d)]
    ranked = sorted(universe, key=lambda p: _key(p, factors))
    for n in range(1, len(universe) + 1):
        tree = trees.step_tree(factors, n)
        assert tree == set(ranked[:n]), n
        assert all(len(p) == 1 or p[:-1] in tree for p in tree)
    assert trees.step_tree(factors, 5, max_depth=1) == {(0,), (1,), (2,)}


def test_a_hand_worked_dynamic_walk():
    """Two heads, top-3, 2-node trees drafted per step from the heads' probabilities.

    pos 0: head 0 [.2 .7 .1], head 1 [.8 .1 .1] -> (1,) .7, (1, 0) .56: tree {(1,), (1, 0)}; the rank
           vector [1, 0] keeps both -> 3 tokens, next step at 3
    pos 3: head 0 [.5 .4 .1], head 1 [.3 .6 .1] -> (0,) .5, (1,) .4: tree {(0,), (1,)}; [0, 2] keeps (0,)
           (the tree of position 0 would keep nothing) -> 2 tokens, next step at 5
    pos 5: [] keeps nothing -> 1 token. 6 tokens in 3 steps.
    The static 2-node trees do worse here: {(0,), (1,)} keeps 1, 1, 0, 0 at positions 0, 2, 4, 5 (4 steps);
    {(0,), (0, 0)} keeps 0, 0, 1, 0, 0 at positions 0, 1, 2, 4, 5 (5 steps)."""
    vectors = [[1, 0], [2, 2], [0, 2], [0, 2], [None, None], []]
    flat = [[0.4, 0.3, 0.3], [0.4, 0.3, 0.3]]  # never consulted: the walk skips these positions...
    probs = [[[0.2, 0.7, 0.1], [0.8, 0.1, 0.1]], flat, flat, [[0.5, 0.4, 0.1], [0.3, 0.6, 0.1]], flat, flat]
    run = ar_run(vectors, probs)
    assert trees.dynamic_walk([run], 2) == [(6, 3)]
    assert trees.Replay([run]).walk({(0,), (1,)}) == [(6, 4)]
    assert trees.Replay([run]).walk({(0,), (0, 0)}) == [(6, 5)]
    probs[1] = probs[2] = [[0.1, 0.1, 0.8], [0.1, 0.1, 0.8]]  # ...so changing them changes nothing
    assert trees.dynamic_walk([ar_run(vectors, probs)], 2) == [(6, 3)]


@pytest.mark.parametrize("seed", range(3))
def test_dynamic_replay_collapses_to_the_static_replay_when_the_scores_do_not_change(seed):
    """The same head probabilities at every step: every step drafts the same tree, the best-first tree
    of those probabilities (`best_tree_independent`), and the dynamic walk is that tree's static replay,
    run by run. The same holds for the calibrated rule, whose factors are then constant too."""
    runs = random_ar_runs(seed, n_runs=6, length=50)
    g = torch.Generator().manual_seed(100 + seed)
    constant = [sorted(torch.rand(3, generator=g).tolist(), reverse=True) for _ in range(3)]
    for run in runs:
        run.head_probs = [constant for _ in run.tokens]
    rp = trees.Replay(runs)
    for n in (1, 2, 5, 9, 20):
        static = trees.best_tree_independent(constant, n)
        assert trees.dynamic_walk(runs, n) == rp.walk({tuple(p) for p in static}), n
        calibration = trees.Calibration.fit(runs, topk=3)
        fixed = calibration.factors(constant)
        by_calibration = trees.best_tree_independent(fixed, n)
        assert trees.dynamic_walk(runs, n, calibration.factors) == rp.walk({tuple(p) for p in by_calibration}), n
        est = trees.estimate_dynamic(runs, n, samples=0)
        assert est.value == pytest.approx(trees.expected_replay(static, runs)) and est.estimator == "dynamic-product"


def test_dynamic_trees_use_the_step_probabilities():
    """A control for the collapse test: with probabilities that vary with the step (confident where the
    top-1 was right), the dynamic tree is no static tree; on these runs it beats the replay optimum."""
    runs = random_ar_runs(11, n_runs=8, length=80, probs=True)
    for n in (2, 4):
        dynamic = trees.estimate_dynamic(runs, n, samples=0).value
        static = trees.expected_replay(trees.best_tree(runs, n, topk=3, max_depth=3), runs)
        assert dynamic > static, n


def test_calibration_counts_hits_by_probability_bin_and_shrinks_to_the_pooled_accuracy():
    # head 0's top-1 at 0.95 four times (right 3 times), at 0.25 twice (right once): 4 hits in 6 steps
    vectors = [[0], [0], [0], [1], [0], [None], []]
    p_hi, p_lo = [[0.95, 0.03, 0.02]], [[0.25, 0.2, 0.1]]
    run = ar_run(vectors, [p_hi, p_hi, p_hi, p_hi, p_lo, p_lo, p_lo])
    cal = trees.Calibration.fit([run], topk=3)
    pooled = 4 / 6
    assert cal.accuracy(0, 0, 0.95) == pytest.approx((3 + PRIOR_WEIGHT * pooled) / (4 + PRIOR_WEIGHT))
    assert cal.accuracy(0, 0, 0.92) == cal.accuracy(0, 0, 0.95)  # the same bin, [0.9, 1]
    assert cal.accuracy(0, 0, 0.25) == pytest.approx((1 + PRIOR_WEIGHT * pooled) / (2 + PRIOR_WEIGHT))
    assert cal.accuracy(0, 0, 0.6) == pytest.approx(pooled)  # an empty bin says the pooled figure
    # rank 1 at 0.03 four times (right once: step 3), at 0.2 twice (never): pooled 1 / 6
    assert cal.accuracy(0, 1, 0.03) == pytest.approx((1 + PRIOR_WEIGHT / 6) / (4 + PRIOR_WEIGHT))
    assert cal.accuracy(1, 0, 0.5) == 0.0  # a head the tuning traces never had
    with pytest.raises(ValueError, match="no head probabilities to calibrate on"):
        trees.Calibration.fit([ar_run(vectors)], topk=3)


def test_paired_comparison_resamples_prompts_jointly():
    runs = random_ar_runs(3, probs=True)
    same = trees.compare_trees(runs, [[0], [0, 0]], [[0], [0, 0]], samples=200)
    assert same.gain == 0 and same.ci95 == (0.0, 0.0) and same.b_better == same.a_better == 0
    more = trees.compare_trees(runs, [[0]], [[0], [1], [0, 0]], samples=200)
    assert more.gain > 0 and more.ci95[0] > 0 and more.b_better > 0 and more.a_better == 0  # a superset never loses
    # jointly resampled, the gain's interval is narrower than the two trees' own intervals side by side
    a, b = (trees.estimate(t, runs, "replay", samples=200) for t in ([[0]], [[0], [1], [0, 0]]))
    assert (more.ci95[1] - more.ci95[0]) * more.a < (a.ci95[1] - a.ci95[0]) + (b.ci95[1] - b.ci95[0])
    with pytest.raises(ValueError, match="the same prompts on both sides"):
        trees.paired([(3, 1)], [(3, 1), (4, 2)])


def test_static_vs_dynamic_at_equal_sizes():
    tune, test = random_ar_runs(21, probs=True), random_ar_runs(22, probs=True)
    rows = trees.static_vs_dynamic(test, [2, 6], tune, samples=100, topk=3, max_depth=3)
    assert [r["nodes"] for r in rows] == [2, 6] and not rows[0]["in_sample"]
    for r in rows:
        assert len(r["static"]["tree"]) == r["nodes"]
        static = trees.expected_replay(r["static"]["tree"], test)
        assert r["static"]["tokens_per_step"] == pytest.approx(static, abs=1e-4)
        for rule in ("product", "calibrated"):
            d = r["dynamic"][rule]
            assert d["a_tokens_per_step"] == pytest.approx(static, abs=1e-4)
            assert d["gain_pct"] == pytest.approx(100 * (d["b_tokens_per_step"] / static - 1), abs=0.02)
            assert d["gain_pct_ci95"][0] <= d["gain_pct"] <= d["gain_pct_ci95"][1]
    assert trees.static_vs_dynamic(test, [2], samples=0, topk=3)[0]["in_sample"]
    with pytest.raises(ValueError, match="no head probabilities"):
        trees.static_vs_dynamic(random_ar_runs(1, n_runs=2), [2], topk=3)


def test_read_runs_keeps_the_heads_probabilities(tmp_path):
    runs = random_ar_runs(5, n_runs=2, length=10, probs=True)
    f = tmp_path / "ar.jsonl"
    write_ar_trace(f, runs)
    back = trees.read_runs(f)
    assert [r.head_probs for r in back] == [r.head_probs for r in runs]
    assert trees.dynamic_walk(back, 3) == trees.dynamic_walk(runs, 3)
    f.write_text(f.read_text().replace('"prob": ', '"prob": 7', 1))
    with pytest.raises(trees.TraceError, match=r":2: 'head_topk' probabilities must be numbers in \[0, 1\]"):
        trees.read_runs(f)


def test_cli_dynamic_and_paired_experiment(tmp_path, capsys):
    tune, test = tmp_path / "tune.jsonl", tmp_path / "test.jsonl"
    write_ar_trace(tune, random_ar_runs(31, n_runs=6, probs=True))
    write_ar_trace(test, random_ar_runs(32, n_runs=6, probs=True))
    assert main(["dynamic", "--traces-test", str(test), "--traces-tune", str(tune), "--nodes", "2,4", "--topk", "3",
                 "--max-depth", "3", "--samples", "50", "--rules", "product"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["nodes"] for r in out["sizes"]] == [2, 4] and set(out["sizes"][0]["dynamic"]) == {"product"}
    with pytest.raises(SystemExit, match="2"):
        main(["dynamic", "--traces-test", str(test), "--rules", "eagle"])
    assert "unknown dynamic-tree rule 'eagle'" in capsys.readouterr().err
    assert main(["experiment", "--traces-tune", str(tune), "--traces-test", str(test), "--tree", "chain_1",
                 "--tree", "kary_2x2", "--samples", "50", "--paired"]) == 0
    row = json.loads(capsys.readouterr().out)["paired"]["kary_2x2 vs chain_1"]["replay_on_test_traces"]
    runs = trees.ar_runs(trees.read_runs(test))
    want = trees.compare_trees(runs, trees.preset("chain_1"), trees.preset("kary_2x2"), samples=50)
    assert row == want.to_json()
    assert main(["experiment", "--traces-tune", str(tune), "--traces-test", str(test), "--tree", "chain_1", "--paired"]) == 2
    assert "give at least two" in capsys.readouterr().err


def test_measured_runs_pair_by_prompt_hash():
    def medusa(key, tokens, steps, request=0):
        header = {"mode": "medusa", "prompt_sha256": key}
        return trees.Run(header=header, tokens=[[0] * (tokens // steps)] * steps, request=request)

    a = [medusa("p1", 8, 4), medusa("p2", 9, 3), medusa("p3", 4, 4)]
    b = [medusa("p2", 9, 3), medusa(["p0", "p1"], 8, 2, request=1)]  # a batched run's header lists a hash per request
    assert trees.pair_measured(a, b) == ([(8, 4), (9, 3)], [(8, 2), (9, 3)])
    with pytest.raises(ValueError, match="carry no prompt hash"):
        trees.pair_measured(a, [trees.Run(header={"mode": "medusa"}, tokens=[[1]])])


def test_engine_headers_pair_two_trees_runs_of_the_same_prompts(demo_engine, tmp_path):
    """Real trace files of two trees on the same prompts (one solo, one batched) carry the run's
    settings and a prompt hash per request, and pair_measured matches them prompt by prompt."""
    prompts = ["def add(a, b):", "import os\n"]
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for p in prompts:
        demo_engine.generate(p, 12, mode="medusa", tree="chain_1", trace_file=str(a))
    demo_engine.generate(prompts[::-1], 12, mode="medusa", tree="demo_tuned", trace_file=str(b), stop_on_eos=False)
    head_a = json.loads(a.read_text().splitlines()[0])
    head_b = json.loads(b.read_text().splitlines()[0])
    ids = [demo_engine.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    assert head_a["prompt_ids"] == ids[0] and head_a["prompt_sha256"] == prompt_hash(ids[0])
    assert head_b["prompt_ids"] == ids[::-1] and head_b["prompt_sha256"] == [prompt_hash(i) for i in ids[::-1]]
    assert (head_a["max_new_tokens"], head_a["stop_on_eos"], head_b["stop_on_eos"]) == (12, True, False)
    assert head_a["dtype"] == "float32" and head_a["device"] == "cpu" and head_a["backend"] == "sdpa"
    runs_a, runs_b = trees.read_runs(a), trees.read_runs(b)
    pa, pb = trees.pair_measured(runs_a, runs_b)
    assert len(pa) == 2
    by_prompt_b = {prompt_hash(ids[1 - r.request]): (r.n_tokens, r.n_steps) for r in runs_b}
    assert pb == [by_prompt_b[prompt_hash(i)] for i in ids]


def test_collect_traces_appends_only_when_asked_and_then_keeps_the_first_collection(tmp_path, capsys):
    from engine.cli import main as engine_main

    out = tmp_path / "traces.jsonl"
    common = ["collect-traces", "--out", str(out), "--device", "cpu", "--max-new-tokens", "6", "--prompts", "1"]
    assert engine_main(common) == 0
    first = out.read_text()
    assert engine_main(common) == 2 and "pass --append" in capsys.readouterr().err
    assert out.read_text() == first  # refused: not touched
    assert engine_main(common + ["--offset", "1", "--append"]) == 0
    text = out.read_text()
    headers = [json.loads(line) for line in text.splitlines() if '"type": "header"' in line]
    assert text.startswith(first) and len(headers) == 2 and headers[0]["prompt_ids"] != headers[1]["prompt_ids"]
    assert len(trees.read_runs(out)) == 2
