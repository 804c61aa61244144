"""Acceptance rules against direct transcriptions on hand-made logits."""

import math

import pytest
import torch

import trees
from engine.accept import verify_greedy, verify_sample, verify_typical

TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


def test_greedy_picks_longest_correct_path():
    b = trees.buffers(TREE, topk=10)
    node_tokens = torch.tensor([5, 7, 8, 9, 3, 2, 4])
    logits = torch.full((7, 12), -5.0)
    # target argmax: root->7 (node 1 ok), node1->3 (node 4 (0,1) ok, node 3 (0,0) wrong), node4 -> 0
    for node, arg in {0: 7, 1: 3, 2: 1, 3: 1, 4: 0, 5: 1, 6: 1}.items():
        logits[node, arg] = 5.0
    row, length = verify_greedy(b.retrieve_indices, node_tokens, logits)
    assert length == 2 and b.retrieve_indices[row, :3].tolist() == [0, 1, 4]


def transcribe_typical(probs_parent, token, eps, delta):
    """Medusa's rule as its reference code writes it: the entropy takes log(p + 1e-5)."""
    h = -sum(p * math.log(p + 1e-5) for p in probs_parent)
    return probs_parent[token] > min(eps, delta * math.exp(-h))


@pytest.mark.parametrize("seed", range(5))
def test_typical_matches_transcription(seed):
    g = torch.Generator().manual_seed(seed)
    b = trees.buffers(TREE, topk=10)
    node_tokens = torch.randint(0, 6, (7,), generator=g)
    logits = torch.randn(7, 6, generator=g) * 2
    temp = 0.7
    row, length = verify_typical(b.retrieve_indices, node_tokens, logits, temp)
    probs = torch.softmax(logits / temp, -1).tolist()
    best = 0
    lengths = []
    for r in b.retrieve_indices.tolist():
        n = 0
        for d in range(1, len(r)):
            if r[d] < 0 or not transcribe_typical(probs[r[d - 1]], int(node_tokens[r[d]]), 0.09, 0.3):
                break
            n += 1
        lengths.append(n)
        best = max(best, n)
    assert length == best
    assert lengths[row] == best


def test_sample_rule_distribution_equals_target():
    """One tree level: the committed token is distributed as p whatever the candidates are."""
    b = trees.buffers([[0], [1], [2]], topk=3)
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    probs = p.expand(4, -1).clone()
    node_tokens = torch.tensor([0, 3, 0, 1])  # root, then candidates 3, 0, 1 (not the argmax first)
    g = torch.Generator().manual_seed(0)
    n = 20000
    counts = torch.zeros(5)
    for _ in range(n):
        path, nxt = verify_sample(b, node_tokens, probs, g)
        tok = int(node_tokens[path[1]]) if len(path) > 1 else int(nxt)
        counts[tok] += 1
    chi2 = float(((counts - n * p) ** 2 / (n * p)).sum())
    assert chi2 < 18.5  # chi-square, 4 dof, p = 0.001


def test_reference_typical_on_a_hand_worked_three_node_example():
    """Medusa's typical acceptance, worked by hand on the tree [[0], [1], [0, 0]] (nodes: root, n1 = (0),
    n2 = (1), n3 = (0, 0)) at temperature 1. Tokens: A=0, B=1, C=2, D=3, E=4, then 50,000 others.
    The drafts: n1 = B, n2 = C (judged at the root's distribution p0), n3 = D (judged at n1's, p1).

    p0 = {A: .78, B: .12, C: .10}. Medusa's entropy H = -sum p ln(p + 1e-5)
       = .78 * .24849 + .12 * 2.12018 + .10 * 2.30249 = 0.67846; 0.3 e^-H = 0.3 * .50740 = 0.15222,
       so the bound is min(0.09, 0.15222) = 0.09: B (.12) and C (.10) pass. (With max instead of min
       the bound would be 0.15222 and both would fail.)
    p1 = {E: .4992, D: .0008, each of the 50,000 others: 1e-5} (sum 1). Medusa's entropy
       = .4992 * ln(1/.49921) + .0008 * ln(1/.00081) + .5 * ln(1/2e-5)
       = .34681 + .00569 + 5.40989 = 5.76239; 0.3 e^-H = 0.3 * .0031436 = 9.431e-4 < 0.09.
       D (8e-4) fails. (The textbook entropy, -sum p ln p = .34682 + .00570 + 5.75646 = 6.10899, would
       give 0.3 * .0022228 = 6.668e-4 and let D pass: the path n1 -> n3 would be kept.)
    Both paths keep one node: [root, n1] and [root, n2]; the most likely wins, ln .12 > ln .10, so the
    step keeps [root, n1] (2 tokens; retrieve_indices lists [root, n2] first, so a first-path tie-break
    would differ) and the next root is the argmax of p1: E. The traced keep probabilities are 1, 1, 0
    for n1, n2, n3.
    """
    import trees as trees_
    from engine.accept import RULES, typical_threshold
    from engine.sampling import SamplingParams

    v = 5 + 50_000
    probs = torch.zeros(4, v, dtype=torch.float64)
    probs[0, :3] = torch.tensor([0.78, 0.12, 0.10], dtype=torch.float64)
    probs[1, 4], probs[1, 3], probs[1, 5:] = 0.4992, 0.0008, 1e-5
    probs[2, 1], probs[2, 0] = 0.7, 0.3
    probs[3, 0] = 1.0
    logits = probs.log().float()  # softmax(logits / 1) = probs
    assert typical_threshold(torch.softmax(logits[0], -1)).item() == pytest.approx(0.09)
    assert typical_threshold(torch.softmax(logits[1], -1)).item() == pytest.approx(9.431e-4, rel=1e-3)
    buf = trees_.buffers([[0], [1], [0, 0]], topk=10)
    node_tokens = torch.tensor([4, 1, 2, 3])  # root (any token), B, C, D
    rule = RULES["typical"]
    nodes, kept, roots = rule.verify(buf, node_tokens[None], logits[None], SamplingParams(1.0), None)
    assert kept.tolist() == [2] and nodes[0, :2].tolist() == [0, 1] and roots.tolist() == [4]
    parent = buf.parent.clamp(min=0)[None]
    keep = rule.keep_prob(logits[None], logits[None].argmax(-1), node_tokens[None], parent, SamplingParams(1.0))
    assert keep[0, 1:].tolist() == [1.0, 1.0, 0.0]


def test_a_new_rule_is_one_registry_entry(demo_engine, monkeypatch):
    """A rule added to RULES alone (greedy's verification under another name, run without graphs) is
    accepted by the config, run by the engine and traced with its keep probability: nothing else names
    the rules."""
    import dataclasses

    from engine import accept

    again = dataclasses.replace(accept.RULES["greedy"], name="greedy_again", label="greedy, again", graphs=False)
    monkeypatch.setitem(accept.RULES, "greedy_again", again)
    prompt = "def read_config(path):"
    want = demo_engine.generate(prompt, 24, mode="medusa", trace=True)
    got = demo_engine.generate(prompt, 24, mode="medusa", accept="greedy_again", temperature=0.9, trace=True)
    assert got.token_ids == want.token_ids and got.steps == want.steps
    assert [t["accept_prob"] for t in got.traces] == [t["accept_prob"] for t in want.traces]
