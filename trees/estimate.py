"""Expected tokens per step of a tree: E = 1 + sum over non-root nodes of P(path correct).

Two estimators: under independence (product of per-head rank accuracies along the path) and
empirically (replaying logged steps: a tree accepts, on each step, the longest of its paths that is
a prefix of that step's rank vector).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from .stats import RankVector
from .tree import validate


def path_probability(path: Sequence[int], acc: Sequence[Sequence[float]]) -> float:
    p = 1.0
    for k, r in enumerate(path):
        p *= acc[k][r] if k < len(acc) and r < len(acc[k]) else 0.0
    return p


def expected_independent(choices: Sequence[Sequence[int]], acc: Sequence[Sequence[float]]) -> float:
    return 1.0 + sum(path_probability(p, acc) for p in validate(choices, topk=_topk(choices, acc)))


def _topk(choices: Sequence[Sequence[int]], acc: Sequence[Sequence[float]]) -> int:
    return max([len(a) for a in acc] + [max(p) + 1 for p in choices if p] + [1])


def accepted_lengths(choices: Sequence[Sequence[int]], vectors: Sequence[RankVector]) -> list[int]:
    """Per logged step, how many tree tokens (beyond the root) this tree would have accepted."""
    nodes = {tuple(p) for p in choices}
    out = []
    for v in vectors:
        n = 0
        while n < len(v) and v[n] is not None and tuple(v[: n + 1]) in nodes:
            n += 1
        out.append(n)
    return out


def expected_empirical(choices: Sequence[Sequence[int]], vectors: Sequence[RankVector]) -> float:
    if not vectors:
        raise ValueError("no logged steps to estimate from")
    lengths = accepted_lengths(choices, vectors)
    return 1.0 + sum(lengths) / len(lengths)


def bootstrap_interval(
    choices: Sequence[Sequence[int]],
    vectors: Sequence[RankVector],
    samples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap over logged steps for the empirical E."""
    lengths = accepted_lengths(choices, vectors)
    if not lengths:
        raise ValueError("no logged steps to estimate from")
    rng = random.Random(seed)
    n = len(lengths)
    means = sorted(1.0 + sum(rng.choices(lengths, k=n)) / n for _ in range(samples))
    lo = means[int((1 - level) / 2 * (samples - 1))]
    hi = means[int((1 + level) / 2 * (samples - 1))]
    return lo, hi
