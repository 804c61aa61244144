import itertools
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import trees
from trees import TreeError

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
    t = trees.from_counts([1, 7, 6])
    assert len(t) == 1 + 7 + 42 and [0, 6, 5] in t
    with pytest.raises(TreeError):
        trees.from_counts([0])


def test_presets():
    assert trees.preset("chain_3") == [[0], [0, 0], [0, 0, 0]]
    mc = trees.preset("mc_sim_7b_63")
    assert len(mc) == 63 and max(len(p) for p in mc) == 4
    assert len(trees.kary(3, 2)) == 12
    with pytest.raises(TreeError, match="unknown tree preset 'nope'"):
        trees.preset("nope")
    trees.register("mine", [[0], [1]])
    assert trees.resolve("mine") == [[0], [1]]


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
def test_empirical_optimiser_beats_every_tree(seed):
    vec = _vectors(seed)
    for n in range(1, 5):
        best = trees.best_tree_empirical(vec, n, topk=3, max_depth=3)
        brute = max(trees.expected_empirical(t, vec) for t in _all_trees(3, 3, n))
        assert trees.expected_empirical(best, vec) == pytest.approx(brute)


def test_empirical_estimate_replays_logged_steps():
    # a hand-made run: two heads, top-3, the stream is what was accepted
    steps = [
        {"step": 0, "accepted_tokens": [5, 6], "head_topk": [[{"token": 6}, {"token": 9}], [{"token": 1}, {"token": 7}]]},
        {"step": 1, "accepted_tokens": [7], "head_topk": [[{"token": 3}, {"token": 8}], [{"token": 4}, {"token": 2}]]},
        {"step": 2, "accepted_tokens": [8, 4], "head_topk": [[{"token": 4}, {"token": 1}], [{"token": 0}, {"token": 0}]]},
    ]
    vec = trees.rank_vectors(steps)
    # step 0: next tokens 6 (head0 rank 0), 7 (head1 rank 1); step 1: 8 (rank 1), 4 (rank 0); step 2: 4 (rank 0)
    assert vec == [[0, 1], [1, 0], [0]]
    assert trees.accepted_lengths([[0], [0, 1]], vec) == [2, 0, 1]
    assert trees.expected_empirical([[0], [1], [1, 0]], vec) == pytest.approx(1 + (1 + 2 + 1) / 3)
    hs = trees.head_stats(vec, 2, topk=2)
    assert hs.counts == [[2, 1], [1, 1]] and hs.totals == [3, 2]
    lo, hi = trees.bootstrap_interval([[0]], vec, samples=200)
    assert lo <= trees.expected_empirical([[0]], vec) <= hi


def test_select_size_and_diff():
    acc = [[0.6, 0.2, 0.1], [0.5, 0.2, 0.1]]
    choice = trees.select_size(lambda n: trees.expected_independent(trees.best_tree_independent(acc, n), acc),
                               [(1, 10.0), (8, 10.0), (64, 40.0)], range(1, 7))
    assert choice.nodes == 6  # flat latency: bigger is better
    d = trees.diff([[0], [1]], [[0], [0, 0]], acc)
    assert d.added == [[0, 0]] and d.removed == [[1]] and d.kept == 1
    assert d.delta_expected == pytest.approx(0.6 * 0.5 - 0.2)


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
