import itertools
import json

import pytest
import torch
from conftest import ar_run, random_ar_runs, write_ar_trace
from hypothesis import given, settings
from hypothesis import strategies as st

import trees
from trees import TreeError
from trees.estimate import step_start_values

GOLDEN = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


def test_golden_buffers():
    b = trees.buffers(GOLDEN, topk=10)
    assert b.tree_indices.tolist() == [0, 1, 2, 11, 12, 11, 21]
    assert b.position_ids.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert b.attn_mask[6].int().tolist() == [1, 1, 0, 1, 0, 0, 1]
    rows = {tuple(x for x in r if x >= 0) for r in b.retrieve_indices.tolist()}
    assert rows == {(0, 1, 3, 6), (0, 2, 5), (0, 1, 4)}
    assert b.parent.tolist() == [-1, 0, 0, 1, 1, 2, 3]


@pytest.mark.parametrize("bad, msg", [
    ([[0, 1]], "prefix [0] is missing"),
    ([[0], [0]], "duplicate"),
    ([[]], "must not be empty"),
    ([[0], [10]], "outside [0, 10)"),
    ([[0], [-1]], "outside [0, 10)"),
    ([[0], ["a"]], "not an integer"),
    ([[0], [True]], "not an integer"),
    ("[[0]]", "must be a list of paths"),
    ([5], "must be a list of integer ranks"),
])
def test_rules_name_the_path(bad, msg):
    with pytest.raises(TreeError, match=msg.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")):
        trees.validate(bad)


def test_depth_beyond_heads():
    with pytest.raises(TreeError, match=r"path \[0, 0, 0\]: depth 3 exceeds the 2 heads"):
        trees.validate([[0], [0, 0], [0, 0, 0]], num_heads=2)


def test_node_order_is_medusas():
    assert trees.validate([[1, 0], [0, 1], [1], [0]]) == [(0,), (1,), (0, 1), (1, 0)]


def test_mask_bits_pack_the_mask():
    t = trees.kary(2, 6)  # 126 nodes + root: two int64 words per row
    b = trees.buffers(t, topk=2)
    assert b.mask_bits.shape == (127, 2)
    for i in range(127):
        for j in range(127):
            bit = (int(b.mask_bits[i, j // 64]) >> (j % 64)) & 1
            assert bit == int(b.attn_mask[i, j])


@st.composite
def random_tree(draw, topk=4, depth=4):
    n = draw(st.integers(1, 30))
    paths: list[tuple[int, ...]] = []
    for _ in range(n):
        parent = draw(st.sampled_from([()] + paths))
        if len(parent) < depth:
            child = parent + (draw(st.integers(0, topk - 1)),)
            if child not in paths:
                paths.append(child)
    return [list(p) for p in paths]


@settings(max_examples=60, deadline=None)
@given(random_tree())
def test_buffer_properties(tree):
    b = trees.buffers(tree, topk=4)
    nodes = [()] + [tuple(p) for p in b.paths]
    for i, a in enumerate(nodes):
        for j, c in enumerate(nodes):
            assert bool(b.attn_mask[i, j]) == (a[: len(c)] == c)  # c is an ancestor-or-self of a
    covered = set()
    for row in b.retrieve_indices.tolist():
        row = [x for x in row if x >= 0]
        assert row[0] == 0
        for d, node in enumerate(row):
            assert len(nodes[node]) == d and nodes[node] == nodes[row[-1]][:d]
        assert not any(nodes[k][:-1] == nodes[row[-1]] for k in range(1, len(nodes)))  # ends at a leaf
        covered.update(row)
    assert covered == set(range(len(nodes)))
    assert b.tree_indices.tolist() == [0] + [p[-1] + 4 * (len(p) - 1) + 1 for p in b.paths]


def test_file_round_trip_and_atomic_save(tmp_path):
    f = tmp_path / "t.json"
    tf = trees.TreeFile(GOLDEN, num_heads=3, name="golden", expected_accepted=1.5, estimator="x", source="test")
    trees.save_tree(tf, f)
    back = trees.load_tree(f)
    assert back.medusa_choices == [list(p) for p in trees.validate(GOLDEN)] and back.name == "golden"
    assert json.loads(f.read_text())["schema_version"] == 1
    with pytest.raises(FileExistsError, match="different tree"):
        trees.save_tree([[0]], f)
    assert trees.load_tree(f).name == "golden"  # the refused save left the file alone
    trees.save_tree([[0]], f, overwrite=True)
    assert trees.load_tree(f).medusa_choices == [[0]]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_interrupted_save_keeps_previous(tmp_path, monkeypatch):
    f = tmp_path / "t.json"
    trees.save_tree(GOLDEN, f)
    before = f.read_text()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", boom)
    with pytest.raises(OSError):
        trees.save_tree([[0]], f, overwrite=True)
    assert f.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]


@pytest.mark.parametrize("text, msg", [
    ('{"medusa_choices": [[0], [0, 0]', "not valid JSON"),
    ("", "not valid JSON"),
    ('{"schema_version": 2, "medusa_choices": [[0]]}', "schema_version 2"),
    ('{"name": "x"}', "missing 'medusa_choices'"),
    ('[[0, 1]]', r"prefix \[0\] is missing"),
])
def test_bad_files_name_the_file(tmp_path, text, msg):
    f = tmp_path / "bad.json"
    f.write_text(text)
    with pytest.raises(TreeError, match=msg) as e:
        trees.load_tree(f)
    assert str(f) in str(e.value)


def test_bare_list_loads(tmp_path):
    f = tmp_path / "bare.json"
    f.write_text("[[0], [0, 0], [1]]")
    assert trees.load_tree(f).medusa_choices == [[0], [1], [0, 0]]


def test_exports_and_counts():
    assert trees.to_trtllm([[0], [0, 0]]) == "[[0],[0,0]]"
    assert trees.to_vllm([[0], [1], [0, 0]]) == "[(0,), (1,), (0, 0)]"


def test_from_counts_reads_medusa_0_1_count_lists_as_0_1_does():
    """[1, 7, 6]: the root (its count is 1), head 0's top 7, head 1's top 6 under each: 7 + 42 = 49 nodes
    of depth 2 (an earlier reading took the 1 as head 0's count: 50 nodes of depth 3)."""
    t = trees.from_counts([1, 7, 6])
    assert len(t) == 49 and max(len(p) for p in t) == 2
    assert [6, 5] in t and [7] not in t and [0, 6] not in t
    assert trees.from_counts([1, 3]) == [[0], [1], [2]]
    for bad, msg in (([0], "positive integers"), ([2, 3], "the first count is the root's"), ([1], "only the root")):
        with pytest.raises(TreeError, match=msg):
            trees.from_counts(bad)


def test_presets():
    assert trees.preset("chain_3") == [[0], [0, 0], [0, 0, 0]]
    mc = trees.preset("mc_sim_7b_63")
    assert len(mc) == 63 and max(len(p) for p in mc) == 4
    assert len(trees.kary(3, 2)) == 12
    with pytest.raises(TreeError, match="unknown tree preset 'nope'"):
        trees.preset("nope")
    trees.register("mine", [[0], [1]])
    assert trees.resolve("mine") == [[0], [1]]
    mine = trees.preset("mine")
    mine[0].append(9)
    mine.append([2])
    assert trees.preset("mine") == [[0], [1]]  # a registered list too: each call's lists are its own
    mc[0].append(5)  # a shipped tree is read once (presets._shipped): every call still gets lists of its own
    mc.pop()
    assert trees.preset("mc_sim_7b_63") == trees.resolve("mc_sim_7b_63") and len(trees.preset("mc_sim_7b_63")[0]) == 1


def _all_trees(topk, depth, n):
    """Every prefix-closed tree with n nodes (brute force for the optimiser)."""
    universe = [p for d in range(1, depth + 1) for p in itertools.product(range(topk), repeat=d)]
    for combo in itertools.combinations(universe, n):
        s = set(combo)
        if all(p[:-1] in s or len(p) == 1 for p in combo):
            yield [list(p) for p in combo]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_best_first_is_optimal_under_independence(seed):
    g = torch.Generator().manual_seed(seed)
    acc = [sorted(torch.rand(3, generator=g).tolist(), reverse=True) for _ in range(3)]
    acc = [[a / (sum(row) * 1.2) for a in row] for row in acc]
    for n in range(1, 6):
        best = trees.best_tree_independent(acc, n)
        brute = max(trees.expected_independent(t, acc) for t in _all_trees(3, 3, n))
        assert trees.expected_independent(best, acc) == pytest.approx(brute)


def _vectors(seed, n=200, heads=3, topk=3):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        v = []
        for _k in range(heads):
            r = int(torch.randint(0, topk + 1, (1,), generator=g))
            v.append(None if r == topk else r)
        out.append(v)
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_position_optimiser_beats_every_tree(seed):
    vec = _vectors(seed)
    for n in range(1, 5):
        best = trees.best_tree_position(vec, n, topk=3, max_depth=3)
        brute = max(trees.expected_position(t, [vec]) for t in _all_trees(3, 3, n))
        assert trees.expected_position(best, [vec]) == pytest.approx(brute)


def test_replay_walks_step_starts():
    """Hand-made rank vectors: the walk visits positions 0, 2, 3, 6 (a run of 7 tokens: 4 steps)."""
    vec = [[0, 1], [1, 1], [None], [0, 0], [0], [0], []]
    run = ar_run(vec)
    assert run.vectors == [[0, 1], [1, 1], [None], [0, 0], [0], [0], []]
    tree = [[0], [0, 1], [1]]
    # pos 0: [0, 1] kept (2) -> pos 3; [0, 0]: [0] kept (1) -> pos 5; [0] kept -> pos 7: 3 steps for 7 tokens
    assert trees.expected_replay(tree, [run]) == pytest.approx(7 / 3)
    # the position-averaged estimate counts every position: L = 2, 1, 0, 1, 1, 1, 0
    assert trees.expected_position(tree, [run]) == pytest.approx(1 + 6 / 7)
    est = trees.estimate(tree, [run, ar_run(vec[:4])], "replay", samples=200)
    assert est.runs == 2 and est.ci95[0] <= est.value <= est.ci95[1]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_replay_optimiser_never_loses_to_its_seed_and_matches_brute_force_when_small(seed):
    runs = random_ar_runs(seed)
    for n in (2, 3):
        tree, log = trees.optimize_replay(runs, n, topk=3, max_depth=3)
        assert log.steps <= log.seed_steps and len(tree) == n
        brute = max(trees.expected_replay(t, runs) for t in _all_trees(3, 3, n))
        assert trees.expected_replay(tree, runs) == pytest.approx(brute)
    tree, log = trees.optimize_replay(runs, 12, topk=3, max_depth=3)
    assert log.steps <= log.seed_steps
    assert trees.expected_replay(tree, runs) >= trees.expected_replay(trees.best_tree_position(runs, 12, 3, 3), runs)


def test_cross_validation_reports_held_out_replay():
    runs = random_ar_runs(3)
    cv = trees.cross_validate(runs, 6, "replay", folds=3, topk=3, max_depth=3)
    assert len(cv["per_fold"]) == 3 and 1 <= cv["heldout_tokens_per_step"] <= 4 and len(cv["tree"]) == 6


def test_bootstrap_is_over_runs():
    """Ten copies of one run: resampling whole runs gives no spread at all (it would over positions)."""
    run = random_ar_runs(4, n_runs=1)[0]
    est = trees.estimate([[0], [0, 0]], [run] * 10, "replay", samples=100)
    assert est.ci95[0] == est.ci95[1] == pytest.approx(est.value)
    mixed = trees.estimate([[0], [0, 0]], random_ar_runs(5), "replay", samples=200)
    assert mixed.ci95[0] < mixed.value < mixed.ci95[1]


def test_step_start_estimator_from_accept_probs():
    tree = [[0], [1], [0, 0]]
    run = trees.Run(header={"mode": "medusa", "acceptance": "sample"}, tokens=[[1, 2], [3]], head_tokens=[[], []],
                    accepted=[2, 1], accept_prob=[[None, 0.5, 0.2, 0.4], [None, 1.0, 0.0, 0.0]], tree=tree)
    # step 1: 1 + 0.5 + 0.2 + 0.5*0.4; step 2: 1 + 1
    assert trees.expected_step_start(tree, [run]) == pytest.approx((1.9 + 2.0) / 2)
    assert trees.expected_step_start([[0]], [run]) == pytest.approx((1.5 + 2.0) / 2)  # a subtree
    with pytest.raises(ValueError, match="not in the tree the run decoded with"):
        trees.expected_step_start([[2]], [run])


def test_select_size_uses_measured_sizes_only():
    points = trees.latency_points({"points": [{"nodes": 0, "step_ms": 5.0}, {"nodes": 8, "step_ms": 9.0},
                                              {"nodes": 16, "step_ms": 10.0}]})
    choice = trees.select_size(lambda n: 1 + n / 8, points)
    assert choice.nodes == 16 and choice.runner_up == 8 and [c["nodes"] for c in choice.curve] == [0, 8, 16]
    assert choice.margin == pytest.approx((3 / 10) / (2 / 9) - 1, abs=1e-3)
    assert trees.latency_points([[1, 5.0], [9, 9.0]]) == {0: {"step_ms": 5.0, "ci95": None}, 8: {"step_ms": 9.0, "ci95": None}}
    with pytest.raises(ValueError, match="latency point"):
        trees.latency_points([[1, 5], [2, "x"]])
    d = trees.diff([[0], [1]], [[0], [0, 0]], lambda t: len(t))
    assert d.added == [[0, 0]] and d.removed == [[1]] and d.kept == 1 and d.delta_expected == 0


def test_cli(tmp_path, capsys):
    from trees.__main__ import main

    f = tmp_path / "t.json"
    f.write_text(json.dumps(GOLDEN))
    assert main(["validate", str(f)]) == 0
    assert main(["show", "chain_2"]) == 0
    assert main(["export", "chain_2", "--to", "vllm"]) == 0
    assert "[(0,), (0, 0)]" in capsys.readouterr().out
    f.write_text("[[0, 1]]")
    assert main(["validate", str(f)]) == 2
    assert "prefix [0] is missing" in capsys.readouterr().err


def test_show_draws_every_node_under_its_parent():
    """`trees show` lists depth-first: a node's parent is the nearest line above it one level up."""
    from trees.__main__ import draw

    lines = draw([[0], [1], [0, 0], [1, 0], [0, 0, 0]]).splitlines()[1:]
    paths = [json.loads(line[line.index("["):]) for line in lines]
    assert paths == [[0], [0, 0], [0, 0, 0], [1], [1, 0]]
    for i, p in enumerate(paths):
        if len(p) > 1:
            parent = next(q for q in reversed(paths[:i]) if len(q) == len(p) - 1)
            assert parent == p[:-1]


def test_the_node_limit_is_exactly_511():
    wide = [[r] for r in range(trees.MAX_NODES + 1)]
    assert trees.MAX_NODES == 511 and len(trees.validate(wide[:511], topk=1024)) == 511
    with pytest.raises(trees.TreeError, match="more than 511 nodes"):
        trees.validate(wide, topk=1024)


def test_step_start_under_typical_is_the_longest_passing_path_not_a_sum():
    """Typical acceptance may pass several siblings and keeps one path: a step's value is 1 + the depth of
    the deepest node whose whole path passes (the sum of reach probabilities, right for greedy and
    sample, would count the siblings too)."""
    tree = [[0], [1], [0, 0]]
    steps = [[None, 1.0, 1.0, 1.0],  # all pass: 1 + 2 (the sum would be 4)
             [None, 0.0, 1.0, 1.0],  # (0) fails, so (0, 0) is not reached: 1 + 1 via (1)
             [None, 0.0, 0.0, 1.0]]  # nothing reached: 1
    run = trees.Run(header={"mode": "medusa", "acceptance": "typical"}, tokens=[[1, 2, 3], [4, 5], [6]],
                    head_tokens=[[], [], []], accepted=[3, 2, 1], accept_prob=steps, tree=tree)
    assert step_start_values(tree, run) == [3.0, 2.0, 1.0]
    assert step_start_values([[0], [1]], run) == [2.0, 2.0, 1.0]  # a subtree of the run's tree
    as_sample = trees.Run(header={"acceptance": "sample"}, tokens=run.tokens, head_tokens=run.head_tokens,
                          accepted=run.accepted, accept_prob=steps, tree=tree)
    assert step_start_values(tree, as_sample) == [4.0, 2.0, 1.0]


def test_cross_validation_needs_two_prompts_and_says_so():
    runs = random_ar_runs(6, n_runs=1)
    with pytest.raises(ValueError, match="cross-validation needs at least 2 prompts, got 1"):
        trees.cross_validate(runs, 4, "replay", folds=5, topk=3, max_depth=3)
    cv = trees.cross_validate(random_ar_runs(6, n_runs=2), 4, "replay", folds=5, topk=3, max_depth=3)
    assert cv["folds"] == 2 and len(cv["per_fold"]) == 2


def test_export_show_and_resolve_check_ranks_against_the_files_own_topk(tmp_path, capsys):
    """A schema-1 file with topk 20 and a rank-15 node is valid (`trees validate` says so); show and
    export must accept it too, while the engine's topk of 10 still refuses it."""
    from trees.__main__ import main

    f = tmp_path / "wide.json"
    trees.save_tree(trees.TreeFile([[0], [15], [15, 0]], num_heads=2, topk=20), f)
    for cmd in (["validate", str(f)], ["show", str(f)], ["export", str(f), "--to", "trtllm"],
                ["export", str(f), "--to", "vllm"]):
        assert main(cmd) == 0, (cmd, capsys.readouterr().err)
    assert "[[0],[15],[15,0]]" in capsys.readouterr().out
    assert trees.resolve(str(f)) == [[0], [15], [15, 0]]
    with pytest.raises(trees.TreeError, match=r"rank 15 is outside \[0, 10\)"):
        trees.resolve(str(f), topk=10)
    f.write_text(json.dumps({"schema_version": 1, "medusa_choices": [[0], [25]], "topk": 20}))
    assert main(["show", str(f)]) == 2 and r"rank 25 is outside [0, 20)" in capsys.readouterr().err


def test_optimize_replay_takes_the_plain_rank_vectors_replay_takes():
    """`Replay` scores runs given as lists of rank vectors; the optimiser built on it raised TypeError on them."""
    runs = random_ar_runs(7, n_runs=4)
    plain = [r.vectors for r in runs]
    assert trees.expected_replay([[0]], plain) == trees.expected_replay([[0]], runs)
    tree, log = trees.optimize_replay(plain, 5, topk=3, max_depth=3)
    assert (tree, log.steps) == (lambda t, g: (t, g.steps))(*trees.optimize_replay(runs, 5, topk=3, max_depth=3))
    assert trees.best_tree(plain, 5, "position", topk=3, max_depth=3) == trees.best_tree(runs, 5, "position", topk=3, max_depth=3)


def test_optimize_cli_limits_topk_depth_and_search_time(tmp_path, capsys):
    from trees.__main__ import main

    traces = tmp_path / "ar.jsonl"
    write_ar_trace(traces, random_ar_runs(8, n_runs=4))
    out = tmp_path / "t.json"
    assert main(["optimize", "--traces", str(traces), "--nodes", "3", "--topk", "2", "--max-depth", "1",
                 "--out", str(out), "--samples", "0"]) == 0, capsys.readouterr().err
    tf = trees.load_tree(out)
    assert tf.medusa_choices == [[0], [1]] and tf.topk == 2 and "--topk 2 --max-depth 1" in tf.source  # 2 ranks, depth 1
    assert main(["optimize", "--traces", str(traces), "--nodes", "6", "--max-depth", "2", "--time-limit", "5",
                 "--out", str(out), "--overwrite", "--samples", "0"]) == 0
    assert max(len(p) for p in trees.load_tree(out).medusa_choices) <= 2
    capsys.readouterr()
    assert main(["optimize", "--traces", str(traces), "--method", "position", "--time-limit", "5", "--out", str(out)]) == 2
    assert "--time-limit bounds the replay optimiser's local search" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="2"):
        main(["optimize", "--traces", str(traces), "--time-limit", "soon", "--out", str(out)])


def test_stats_reads_several_files(tmp_path, capsys):
    from trees.__main__ import main

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_ar_trace(a, random_ar_runs(1, n_runs=3, length=20))
    write_ar_trace(b, random_ar_runs(2, n_runs=2, length=30))
    assert main(["stats", str(a), str(b), "--tree", "chain_2", "--samples", "20"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["runs"] == 5 and out["steps"] == 3 * 20 + 2 * 30
    assert [(f["runs"], f["steps"]) for f in out["files"]] == [(3, 60), (2, 60)]
    pooled = trees.ar_runs(trees.read_runs(a)) + trees.ar_runs(trees.read_runs(b))
    assert out["estimates"]["replay"]["value"] == round(trees.expected_replay(trees.preset("chain_2"), pooled), 4)


def test_exporters_warn_when_a_tree_will_not_survive_its_target(tmp_path, capsys):
    from trees.__main__ import main

    gapped = [[0], [2], [0, 0]]  # depth-1 ranks 0 and 2: our optimiser makes such trees
    assert trees.export_warnings(gapped, "trtllm") == [
        "depth-1 ranks [0, 2] are not 0..1: TensorRT-LLM's older Python-session Medusa parser corrupts such trees"]
    assert trees.export_warnings([[0], [1], [0, 0]], "trtllm") == []
    big = trees.kary(8, 2)  # 72 nodes
    assert "an engine built with max_draft_len 63" in trees.export_warnings(big, "trtllm")[0]
    assert trees.export_warnings(trees.preset("mc_sim_7b_63"), "trtllm") == []
    assert trees.export_warnings(trees.chain(4), "vllm") == []
    assert "drafts each head's top-1" in trees.export_warnings([[0], [1]], "vllm")[0]
    f = tmp_path / "gapped.json"
    f.write_text(json.dumps(gapped))
    assert main(["export", str(f), "--to", "trtllm"]) == 0  # a warning, not an error
    out = capsys.readouterr()
    assert out.out.strip() == "[[0],[2],[0,0]]"
    assert out.err.count("\n") == 1 and out.err.startswith("warning: depth-1 ranks [0, 2] are not 0..1")
    assert main(["export", "chain_3", "--to", "vllm"]) == 0 and capsys.readouterr().err == ""
