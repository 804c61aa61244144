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
    h = -sum(p * math.log(p) for p in probs_parent if p > 0)
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
