"""Choose trees: the n-node tree with the greatest estimated E, and the size that is fastest.

Best-first search is exactly optimal for both estimators. Each node's value (its path probability
under independence, or its frequency as a prefix of logged rank vectors) never exceeds its parent's,
so the n best-valued nodes reachable from the root form a prefix-closed set, and E is the sum of
the chosen nodes' values: taking the best frontier node each time cannot be beaten.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .estimate import path_probability
from .stats import RankVector
from .tree import as_lists, sort_paths, validate


def _best_first(value: Callable[[tuple[int, ...]], float], nodes: int, topk: int, max_depth: int) -> list[list[int]]:
    chosen: list[tuple[int, ...]] = []
    # ties go to the shallower, then lexicographically smaller path: deterministic and readable
    heap = [(-value((r,)), 1, (r,)) for r in range(topk)]
    heapq.heapify(heap)
    while heap and len(chosen) < nodes:
        _, _, path = heapq.heappop(heap)
        chosen.append(path)
        if len(path) < max_depth:
            for r in range(topk):
                child = path + (r,)
                heapq.heappush(heap, (-value(child), len(child), child))
    return as_lists(validate(chosen, topk=topk))


def best_tree_independent(acc: Sequence[Sequence[float]], nodes: int, max_depth: int | None = None) -> list[list[int]]:
    """Optimal tree of `nodes` nodes when heads are independent with rank accuracies acc[k][r]."""
    depth = len(acc) if max_depth is None else min(max_depth, len(acc))
    topk = max(len(a) for a in acc)
    return _best_first(lambda p: path_probability(p, acc), nodes, topk, depth)


def prefix_frequencies(vectors: Sequence[RankVector]) -> Counter:
    freq: Counter = Counter()
    for v in vectors:
        for d in range(1, len(v) + 1):
            if v[d - 1] is None:
                break
            freq[tuple(v[:d])] += 1
    return freq


def best_tree_empirical(vectors: Sequence[RankVector], nodes: int, topk: int = 10, max_depth: int | None = None) -> list[list[int]]:
    """Tree of `nodes` nodes that would have accepted the most tokens on the logged steps."""
    if not vectors:
        raise ValueError("no logged steps to optimise on")
    freq = prefix_frequencies(vectors)
    depth = max(len(v) for v in vectors) if max_depth is None else max_depth
    return _best_first(lambda p: freq.get(p, 0), nodes, topk, max(depth, 1))


def interpolate_latency(curve: Sequence[tuple[int, float]], n: int) -> float:
    """Piecewise-linear step latency at tree size n from measured (nodes, ms) points."""
    pts = sorted(curve)
    if not pts:
        raise ValueError("empty latency curve")
    if n <= pts[0][0]:
        return pts[0][1]
    for (n0, t0), (n1, t1) in zip(pts, pts[1:]):
        if n <= n1:
            return t0 + (t1 - t0) * (n - n0) / (n1 - n0)
    if len(pts) == 1:
        return pts[0][1]
    (n0, t0), (n1, t1) = pts[-2], pts[-1]
    return t1 + (t1 - t0) * (n - n1) / (n1 - n0)


@dataclass
class SizeChoice:
    nodes: int
    expected: float
    step_ms: float
    tokens_per_s: float
    curve: list[dict]


def select_size(expected_of_n: Callable[[int], float], latency: Sequence[tuple[int, float]], sizes: Sequence[int]) -> SizeChoice:
    """Pick n maximising E(n) / t_step(n)."""
    curve = []
    for n in sizes:
        e = expected_of_n(n)
        ms = interpolate_latency(latency, n + 1)  # +1: the step also runs the root
        curve.append({"nodes": n, "expected": e, "step_ms": ms, "tokens_per_s": 1000.0 * e / ms})
    best = max(curve, key=lambda c: c["tokens_per_s"])
    return SizeChoice(best["nodes"], best["expected"], best["step_ms"], best["tokens_per_s"], curve)


@dataclass
class TreeDiff:
    added: list[list[int]]
    removed: list[list[int]]
    kept: int
    delta_expected: float | None


def diff(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]], acc: Sequence[Sequence[float]] | None = None) -> TreeDiff:
    """What going from tree a to tree b adds and removes, and the change in E under independence."""
    sa = {tuple(p) for p in validate(a, topk=10**9)}
    sb = {tuple(p) for p in validate(b, topk=10**9)}
    delta = None
    if acc is not None:
        delta = sum(path_probability(p, acc) for p in sb - sa) - sum(path_probability(p, acc) for p in sa - sb)
    return TreeDiff(as_lists(sort_paths(sb - sa)), as_lists(sort_paths(sa - sb)), len(sa & sb), delta)
