"""Dynamic trees replayed on AR traces: each step drafts its own n-node tree from the heads'
probabilities at that step, instead of one fixed tree for every step (docs/estimators.md).

A Medusa node's token depends only on its depth and rank (head d's rank-r candidate), so a step's
tree is chosen from one factor per (head, rank) at that step: a path scores the product of its
nodes' factors, and the step's tree is the n best-scoring paths. Factors are at most 1, so a child
never outscores its parent and the n best paths always form a tree.

  product     EAGLE-2's rule: a node's factor is its head's probability for that candidate.
  calibrated  that probability mapped through `Calibration`: how often, on tuning traces, head k's
              rank-r candidate with a probability in that bin was the token that came.

Example: two heads whose top-2 probabilities at a step are [0.6, 0.3] and [0.5, 0.4]. Paths score
(0,) 0.6, (1,) 0.3, (0, 0) 0.30, (0, 1) 0.24, (1, 0) 0.15: the 3-node tree of that step is
{(0,), (1,), (0, 0)} (the tie at 0.3 goes to the shallower path), whatever the tree of the next step.

The replay is the static one's walk (`estimate.Replay.walk`) with the tree rebuilt at every step
start. Greedy Medusa's output is AR's, and the heads at a step start see the prefix AR saw there, so
a step keeps the longest path of *its* tree that is a prefix of the rank vector at that position:
the walk is as exact for a tree drafted this way as for a fixed one. When the factors are the same
at every step, every step builds the same tree and the walk is the static replay of that tree.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .estimate import Estimate, Path, Replay, bootstrap
from .stats import Run

Factors = Sequence[Sequence[float]]  # per head, per rank: what a path through that candidate multiplies by
RULES = ("product", "calibrated")
BIN_EDGES = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)  # lower edges of the calibration's bins
PRIOR_WEIGHT = 10  # a bin's accuracy is shrunk toward its (head, rank)'s pooled accuracy by this many steps


def step_tree(factors: Factors, nodes: int, max_depth: int | None = None) -> set[Path]:
    """The `nodes` paths of greatest product of factors (ties: the shallower, then the smaller path,
    as `optimize.best_tree_independent` breaks them). Lazy best-first: a popped path offers only its
    best child and its next sibling, so a step costs O(n log n), not O(n topk log n).

    >>> sorted(step_tree([[0.6, 0.3], [0.5, 0.4]], 3))
    [(0,), (0, 0), (1,)]
    """
    depth = len(factors) if max_depth is None else min(max_depth, len(factors))
    # children of a scoring parent in order of factor (then rank); of a zero-score parent, by rank
    by_factor = [sorted(range(len(f)), key=lambda r, f=f: (-f[r], r)) for f in factors[:depth]]
    by_rank = [list(range(len(f))) for f in factors[:depth]]

    def entry(parent: Path, parent_score: float, i: int) -> tuple:
        order = (by_factor if parent_score > 0 else by_rank)[len(parent)]
        r = order[i]
        score = parent_score * factors[len(parent)][r]
        return -score, len(parent) + 1, parent + (r,), parent_score, i, order

    chosen: set[Path] = set()
    heap = [entry((), 1.0, 0)] if depth and by_rank[0] else []
    while heap and len(chosen) < nodes:
        neg, d, path, parent_score, i, order = heapq.heappop(heap)
        chosen.add(path)
        if i + 1 < len(order):
            heapq.heappush(heap, entry(path[:-1], parent_score, i + 1))
        if d < depth and by_rank[d]:
            heapq.heappush(heap, entry(path, -neg, 0))
    return chosen


def product_factors(probs: Sequence[Sequence[float | None]]) -> list[list[float]]:
    """EAGLE-2's rule: each candidate's factor is its head's probability (unrecorded: 0)."""
    return [[p or 0.0 for p in head] for head in probs]


def _bin(p: float) -> int:
    return bisect_right(BIN_EDGES, p) - 1


@dataclass
class Calibration:
    """How often head k's rank-r candidate was the token that came, by the bin of its probability
    (BIN_EDGES), counted over the AR steps of tuning traces. A bin's accuracy is
    (hits + PRIOR_WEIGHT * pooled) / (steps + PRIOR_WEIGHT), pooled = the (head, rank)'s accuracy
    over every bin, so a bin seen a few times says little and an unseen one says the pooled figure.

    Example: head 1, rank 0, probability 0.42 (bin [0.3, 0.5)); on the tuning traces that bin held
    30 steps with 12 hits, and head 1's rank 0 was right in 35 % of all its steps: the factor is
    (12 + 10 * 0.35) / (30 + 10) = 0.3875."""

    hits: list[list[list[int]]]  # [head][rank][bin]
    steps: list[list[list[int]]]

    @classmethod
    def fit(cls, runs: Sequence[Run], topk: int = 10) -> Calibration:
        heads = max((len(p) for r in runs for p in r.head_probs), default=0)
        hits = [[[0] * len(BIN_EDGES) for _ in range(topk)] for _ in range(heads)]
        steps = [[[0] * len(BIN_EDGES) for _ in range(topk)] for _ in range(heads)]
        for run in runs:
            for vector, probs in zip(run.vectors, run.head_probs):
                for k, rank in enumerate(vector):  # only heads whose target is known
                    for r, p in enumerate(probs[k][:topk]):
                        if p is None:
                            continue
                        b = _bin(p)
                        steps[k][r][b] += 1
                        hits[k][r][b] += rank == r
        if not any(any(any(row) for row in head) for head in steps):
            raise ValueError("no head probabilities to calibrate on (AR traces with head_topk)")
        return cls(hits, steps)

    def accuracy(self, head: int, rank: int, prob: float) -> float:
        if head >= len(self.steps) or rank >= len(self.steps[head]):
            return 0.0
        hits, steps = self.hits[head][rank], self.steps[head][rank]
        pooled = sum(hits) / sum(steps) if sum(steps) else 0.0
        b = _bin(prob)
        return (hits[b] + PRIOR_WEIGHT * pooled) / (steps[b] + PRIOR_WEIGHT)

    def factors(self, probs: Sequence[Sequence[float | None]]) -> list[list[float]]:
        return [[0.0 if p is None else self.accuracy(k, r, p) for r, p in enumerate(head)] for k, head in enumerate(probs)]

    def to_json(self) -> dict:
        return {"bin_edges": list(BIN_EDGES), "prior_weight": PRIOR_WEIGHT, "hits": self.hits, "steps": self.steps}


def rule_factors(rule: str, tune: Sequence[Run] | None = None, topk: int = 10
                 ) -> Callable[[Sequence[Sequence[float | None]]], list[list[float]]]:
    """The factor function of a rule: 'product', or 'calibrated' (fitted on `tune`)."""
    if rule == "product":
        return product_factors
    if rule == "calibrated":
        if not tune:
            raise ValueError("the calibrated rule needs tuning traces to measure the heads' accuracy on")
        return Calibration.fit(tune, topk).factors
    raise ValueError(f"unknown dynamic-tree rule {rule!r}; choose from {', '.join(RULES)}")


def _with_probs(runs: Sequence[Run]) -> Sequence[Run]:
    if not any(any(p is not None for head in step for p in head) for r in runs for step in r.head_probs):
        raise ValueError("these traces hold no head probabilities (head_topk 'prob'); a dynamic tree is drafted "
                         "from them")
    return runs


def dynamic_walk(runs: Sequence[Run], nodes: int, factors: Callable = product_factors, max_depth: int | None = None,
                 replay: Replay | None = None) -> list[tuple[int, int]]:
    """(tokens, steps) of each run when every step drafts the `nodes`-node tree of its own factors."""
    runs = _with_probs(runs)
    rp = replay or Replay(runs)
    return rp.walk(lambda r, i: step_tree(factors(runs[r].head_probs[i]), nodes, max_depth))


def estimate_dynamic(runs: Sequence[Run], nodes: int, rule: str = "product", tune: Sequence[Run] | None = None,
                     samples: int = 1000, seed: int = 0, max_depth: int | None = None, topk: int = 10,
                     replay: Replay | None = None) -> Estimate:
    """Tokens/step of an n-node dynamic tree under `rule` replayed on `runs`, with a bootstrap
    interval over runs (the calibrated rule is fitted on `tune`)."""
    per_run = [w for w in dynamic_walk(runs, nodes, rule_factors(rule, tune, topk), max_depth, replay) if w[0]]

    def stat(rs):
        return sum(t for t, _ in rs) / sum(s for _, s in rs)

    return Estimate(stat(per_run), bootstrap(per_run, stat, samples, seed), f"dynamic-{rule}", len(per_run),
                    sum(t for t, _ in per_run))
