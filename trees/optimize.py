"""Choose trees: the n-node tree with the greatest estimated tokens/step, and the size that is fastest.

Best-first search is exactly optimal for the independent and position-averaged estimators: each
node's value (its path probability, or its frequency as a prefix of logged rank vectors) never
exceeds its parent's, so the n best-valued nodes form a prefix-closed set and E is the sum of their
values. The replay objective (docs/estimators.md) is not a sum over nodes: which positions a run
visits depends on the whole tree. `optimize_replay` seeds with the best-first tree and then climbs
by swaps (one leaf out, one frontier node in) while the replayed step count falls; `cross_validate`
says how the result does on prompts it was not tuned on.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .estimate import Replay, path_probability
from .stats import RankVector, Run
from .tree import MAX_TOPK, as_lists, sort_paths, validate

Path = tuple[int, ...]


def _best_first(value: Callable[[Path], float], nodes: int, topk: int, max_depth: int) -> list[list[int]]:
    chosen: list[Path] = []
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


def _vectors(runs: Sequence[Run] | Sequence[Sequence[RankVector]] | Sequence[RankVector]) -> list[RankVector]:
    """Every rank vector of Runs, of runs given as lists of rank vectors (what `Replay` takes), or of
    one flat list of rank vectors. A rank vector holds ranks or None, a run holds lists: the first
    entry says which (an empty one adds no prefix either way)."""
    out: list[RankVector] = []
    for r in runs:
        if isinstance(r, Run):
            out.extend(r.vectors)
        elif r and isinstance(r[0], list):
            out.extend(r)
        else:
            out.append(r)
    return out


def prefix_frequencies(vectors: Sequence[RankVector]) -> Counter:
    freq: Counter = Counter()
    for v in vectors:
        for d in range(1, len(v) + 1):
            if v[d - 1] is None:
                break
            freq[tuple(v[:d])] += 1
    return freq


def best_tree_position(runs, nodes: int, topk: int = 10, max_depth: int | None = None) -> list[list[int]]:
    """Tree of `nodes` nodes that keeps the most tokens summed over every logged position (the
    position-averaged objective; `runs`: Runs or plain rank vectors)."""
    vectors = _vectors(runs)
    if not vectors:
        raise ValueError("no logged steps to optimise on")
    freq = prefix_frequencies(vectors)
    depth = max(len(v) for v in vectors) if max_depth is None else max_depth
    return _best_first(lambda p: freq.get(p, 0), nodes, topk, max(depth, 1))


@dataclass
class SearchLog:
    seed_steps: int
    steps: int
    tokens: int
    rounds: int
    evaluations: int
    seconds: float


def optimize_replay(runs: Sequence[Run], nodes: int, topk: int = 10, max_depth: int | None = None,
                    candidates: int = 8, max_rounds: int = 200, time_limit: float | None = None,
                    replay: Replay | None = None) -> tuple[list[list[int]], SearchLog]:
    """The n-node tree with the fewest replayed steps found by local search from the best-first tree:
    each round scores every leaf's removal and every frontier node's addition alone, then tries the
    `candidates` best of each in pairs (out, in) and keeps the best pair that lowers the step count."""
    t0 = time.perf_counter()
    rp = replay or Replay(runs)
    vectors = _vectors(runs)
    freq = prefix_frequencies(vectors)
    depth = max(len(v) for v in vectors) if max_depth is None else max_depth
    tree = {tuple(p) for p in best_tree_position(vectors, nodes, topk, depth)}
    best = rp.steps(tree)
    seed_steps, evals, rounds = best, 1, 0
    for rounds in range(1, max_rounds + 1):  # noqa: B007 (rounds is reported)
        if time_limit is not None and time.perf_counter() - t0 > time_limit:
            break
        parents = {p[:-1] for p in tree}
        leaves = [p for p in tree if p not in parents]
        frontier = [c for c in {p + (r,) for p in tree | {()} if len(p) < depth for r in range(topk)} - tree
                    if freq.get(c, 0) > 0]
        if not frontier or not leaves:
            break
        removal = sorted(leaves, key=lambda p: rp.steps(tree - {p}))[:candidates]
        addition = sorted(frontier, key=lambda p: (rp.steps(tree | {p}), -freq[p], p))[:candidates]
        evals += len(leaves) + len(frontier)
        move = None
        for out in removal:
            for new in addition:
                if new[:-1] == out:  # the new node hangs under the leaf going out
                    continue
                s = rp.steps((tree - {out}) | {new})
                evals += 1
                if s < best:
                    best, move = s, (out, new)
        if move is None:
            break
        tree = (tree - {move[0]}) | {move[1]}
    log = SearchLog(seed_steps, best, rp.tokens(), rounds, evals, round(time.perf_counter() - t0, 3))
    return as_lists(sort_paths(tree)), log


def best_tree(runs: Sequence[Run], nodes: int, method: str = "replay", topk: int = 10,
              max_depth: int | None = None, **kw) -> list[list[int]]:
    """The optimiser behind every front door: 'replay' (default, local search), 'position' or
    'independent' (best-first)."""
    if method == "replay":
        return optimize_replay(runs, nodes, topk, max_depth, **kw)[0]
    if method == "position":
        return best_tree_position(runs, nodes, topk, max_depth)
    if method == "independent":
        from .stats import head_stats

        vectors = _vectors(runs)
        depth = max(len(v) for v in vectors) if max_depth is None else max_depth
        return best_tree_independent(head_stats(vectors, depth, topk).accuracy(), nodes, depth)
    raise ValueError(f"unknown optimiser {method!r}; choose replay, position or independent")


def cross_validate(runs: Sequence[Run], nodes: int, method: str = "replay", folds: int = 5, topk: int = 10,
                   max_depth: int | None = None, seed: int = 0, **kw) -> dict:
    """k-fold over runs (prompts): tune on k-1 folds, replay the tree on the held-out fold. Pooled
    held-out tokens/step beside the in-sample figure of a tree tuned on every run."""
    runs = [r for r in runs if r.n_tokens]
    if len(runs) < 2:  # with one, a fold would hold out nothing (or tune on nothing)
        raise ValueError(f"cross-validation needs at least 2 prompts, got {len(runs)}")
    folds = max(2, min(folds, len(runs)))
    order = list(range(len(runs)))
    random.Random(seed).shuffle(order)
    tokens = steps = 0
    per_fold = []
    for f in range(folds):
        test = [runs[i] for i in order[f::folds]]
        tune = [runs[i] for j, i in enumerate(order) if j % folds != f]
        tree = {tuple(p) for p in best_tree(tune, nodes, method, topk, max_depth, **kw)}
        walk = Replay(test).walk(tree)
        t, s = sum(x for x, _ in walk), sum(y for _, y in walk)
        tokens, steps = tokens + t, steps + s
        per_fold.append(round(t / s, 4))
    full = best_tree(runs, nodes, method, topk, max_depth, **kw)
    in_sample = Replay(runs)
    return {"method": method, "nodes": nodes, "folds": folds, "heldout_tokens_per_step": round(tokens / steps, 4),
            "per_fold": per_fold, "in_sample_tokens_per_step": round(in_sample.tokens() / in_sample.steps(
                {tuple(p) for p in full}), 4), "tree": full}


@dataclass
class SizeChoice:
    nodes: int
    expected: float
    step_ms: float
    tokens_per_s: float
    margin: float  # predicted tokens/s of the choice over the runner-up's, minus 1
    runner_up: int | None
    curve: list[dict]


MIN_STEP_MS, MAX_STEP_MS = 1e-6, 1e9  # a step of a nanosecond to eleven days: every tokens/s stays finite


def latency_points(obj: object) -> dict[int, dict]:
    """Measured step times by tree size (non-root nodes; 0 = AR as the engine runs it) from a
    `bench --part latency` JSON ({"points": [{"nodes", "step_ms", "ci95"}...]}) or the older
    [[nodes including the root, ms], ...] list."""
    points: dict[int, dict] = {}
    items = obj.get("points") if isinstance(obj, dict) else obj
    if not isinstance(items, list) or not items:
        raise ValueError("a latency file holds {'points': [{'nodes': n, 'step_ms': ms}, ...]} or [[nodes, ms], ...]")
    for it in items:
        if isinstance(it, dict):
            n, ms, ci = it.get("nodes"), it.get("step_ms"), it.get("ci95")
        elif isinstance(it, list) and len(it) == 2:
            n, ms, ci = (it[0] - 1 if isinstance(it[0], int) else it[0]), it[1], None
        else:
            raise ValueError(f"latency point {it!r}: expected {{'nodes': n, 'step_ms': ms}} or [nodes, ms]")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0 or isinstance(ms, bool) or \
                not isinstance(ms, (int, float)) or not MIN_STEP_MS <= ms <= MAX_STEP_MS:
            raise ValueError(f"latency point {it!r}: nodes must be an integer >= 0 and step_ms a number in "
                             f"[{MIN_STEP_MS}, {MAX_STEP_MS:.0e}] (milliseconds)")
        points[n] = {"step_ms": float(ms), "ci95": ci}
    return points


def select_size(expected_of_n: Callable[[int], float], latency: dict[int, dict], max_nodes: int | None = None) -> SizeChoice:
    """Pick the measured size n maximising E(n) / t_step(n); only sizes whose step time was measured
    are candidates (no interpolation: a 1-3 node tree is not as cheap as a line through the AR point
    says). Size 0 is AR (E = 1)."""
    curve, rate = [], {}
    for n in sorted(latency):
        if max_nodes is not None and n > max_nodes:
            continue
        e = 1.0 if n == 0 else expected_of_n(n)
        ms = latency[n]["step_ms"]
        if not (isinstance(ms, (int, float)) and MIN_STEP_MS <= ms <= MAX_STEP_MS and math.isfinite(e) and e > 0):
            raise ValueError(f"size {n}: step_ms {ms!r} and E {e!r} must be finite and positive")
        rate[n] = 1000.0 * e / ms
        curve.append({"nodes": n, "expected": round(e, 4), "step_ms": ms, "step_ms_ci95": latency[n]["ci95"],
                      "tokens_per_s": round(rate[n], 2)})
    if not curve:
        raise ValueError("no measured tree size to choose from")
    ranked = sorted(curve, key=lambda c: -rate[c["nodes"]])
    best = ranked[0]
    second = ranked[1] if len(ranked) > 1 else None
    margin = rate[best["nodes"]] / rate[second["nodes"]] - 1 if second else float("inf")
    return SizeChoice(best["nodes"], best["expected"], best["step_ms"], best["tokens_per_s"], round(margin, 4),
                      second["nodes"] if second else None, curve)


@dataclass
class TreeDiff:
    added: list[list[int]]
    removed: list[list[int]]
    kept: int
    delta_expected: float | None


def diff(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]], estimate: Callable[[list[list[int]]], float] | None = None
         ) -> TreeDiff:
    """What going from tree a to tree b adds and removes, and the change in estimated E."""
    sa = {tuple(p) for p in validate(a, topk=MAX_TOPK)}
    sb = {tuple(p) for p in validate(b, topk=MAX_TOPK)}
    delta = None
    if estimate is not None:
        delta = estimate(as_lists(sort_paths(sb))) - estimate(as_lists(sort_paths(sa)))
    return TreeDiff(as_lists(sort_paths(sb - sa)), as_lists(sort_paths(sa - sb)), len(sa & sb), delta)
