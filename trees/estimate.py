"""Expected tokens per step of a tree, from traces (docs/estimators.md says which to trust when).

  replay       (greedy; the default) Walk each AR run as Medusa would: at position i the tree keeps
               L(i) tokens beyond the root (its longest path that is a prefix of i's rank vector),
               and the next step starts at i + 1 + L(i). Greedy Medusa output equals AR output and
               the heads at a step start see the same prefix as AR did there, so this is exactly the
               tokens/step a real run of the tree on those prompts measures. Pooled over runs:
               tokens / steps, the figure a benchmark reports.
  position     1 + the mean of L(i) over every position. Biased high: a real run evaluates the heads
               only at step starts, which follow rejections and are harder than the average
               position (+6 to +16 % on the demo model).
  independent  1 + sum over nodes of the product of per-head rank accuracies along the path. Heads
               are correlated (independence understates joint paths) and the accuracies are
               position-averaged (overstating): the two errors partly cancel, by luck.
  step-start   (typical / sample) From a Medusa run's traces, at the run's own step starts: for
               sampling, 1 + the sum over the tree's nodes of the product of the rule's per-node
               acceptance probabilities along the path (`accept_prob`: recursive rejection keeps one
               child, so these events are disjoint); for typical acceptance, 1 + the depth of the
               longest path whose nodes all pass. The tree must be a subtree of the one that ran, and
               its step starts are the traced run's, not its own (docs/estimators.md).
Intervals are percentile bootstraps over runs (whole prompts), never over positions: acceptance
along a text is autocorrelated (lag-1 0.60 on the demo model), so positions are not independent.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .stats import RankVector, Run, head_stats
from .tree import MAX_TOPK, validate

Path = tuple[int, ...]
ESTIMATORS = ("replay", "position", "independent", "step-start")


def path_probability(path: Sequence[int], acc: Sequence[Sequence[float]]) -> float:
    p = 1.0
    for k, r in enumerate(path):
        p *= acc[k][r] if k < len(acc) and r < len(acc[k]) else 0.0
    return p


def expected_independent(choices: Sequence[Sequence[int]], acc: Sequence[Sequence[float]]) -> float:
    return 1.0 + sum(path_probability(p, acc) for p in validate(choices, topk=MAX_TOPK))


def _prefixes(v: RankVector) -> list[Path]:
    out, p = [], ()
    for r in v:
        if r is None:
            break
        p = p + (r,)
        out.append(p)
    return out


def accepted_length(tree: set[Path], chain: Sequence[Path]) -> int:
    """Tokens beyond the root the tree keeps at a position whose rank-vector prefixes are `chain`."""
    n = 0
    for p in chain:
        if p not in tree:
            break
        n += 1
    return n


class Replay:
    """Rank-vector prefixes of every position of every run, precomputed so one tree is scored by a
    walk over its step starts only (about N / E lookups for N positions)."""

    def __init__(self, runs: Sequence[Run] | Sequence[Sequence[RankVector]]):
        self.chains = [[_prefixes(v) for v in (r.vectors if isinstance(r, Run) else r)] for r in runs]
        if not any(self.chains):
            raise ValueError("no logged AR steps to estimate from (collect AR traces with head top-k)")

    def walk(self, tree: set[Path] | Callable[[int, int], set[Path]]) -> list[tuple[int, int]]:
        """(tokens, steps) of each run under the tree: a fixed one, or tree(run, position) -> the tree
        of the step that starts there (a dynamic tree, trees/dynamic.py), asked at step starts only."""
        dynamic = callable(tree)
        out = []
        for r, chains in enumerate(self.chains):
            n, i, steps = len(chains), 0, 0
            while i < n:
                steps += 1
                i += 1 + accepted_length(tree(r, i) if dynamic else tree, chains[i])
            out.append((n, steps))
        return out

    def steps(self, tree: set[Path]) -> int:
        return sum(s for _, s in self.walk(tree))

    def tokens(self) -> int:
        return sum(len(c) for c in self.chains)

    def lengths(self, tree: set[Path]) -> list[tuple[int, int]]:
        """(sum of L(i) over positions, positions) of each run: the position-averaged estimator."""
        return [(sum(accepted_length(tree, c) for c in chains), len(chains)) for chains in self.chains]


def _tree_set(choices: Sequence[Sequence[int]]) -> set[Path]:
    return {tuple(p) for p in validate(choices, topk=MAX_TOPK)}


def expected_replay(choices: Sequence[Sequence[int]], runs) -> float:
    rp = runs if isinstance(runs, Replay) else Replay(runs)
    return rp.tokens() / rp.steps(_tree_set(choices))


def expected_position(choices: Sequence[Sequence[int]], runs) -> float:
    rp = runs if isinstance(runs, Replay) else Replay(runs)
    per = rp.lengths(_tree_set(choices))
    return 1.0 + sum(a for a, _ in per) / max(1, sum(n for _, n in per))


def step_start_values(choices: Sequence[Sequence[int]], run: Run) -> list[float]:
    """Per step of a Medusa run: expected tokens the tree `choices` keeps (see the module docstring)."""
    if not run.tree or len(run.accept_prob) != run.n_steps:
        raise ValueError("the step-start estimator needs Medusa-run traces with accept_prob")
    index = {tuple(p): i + 1 for i, p in enumerate(validate(run.tree, topk=MAX_TOPK))}
    wanted = [tuple(p) for p in validate(choices, topk=MAX_TOPK)]
    missing = [list(p) for p in wanted if p not in index]
    if missing:
        raise ValueError(f"path {missing[0]} is not in the tree the run decoded with; the step-start estimator "
                         "only scores subtrees of it")
    # typical acceptance may pass several siblings and keeps the longest acceptable path; under greedy
    # and recursive-rejection sampling at most one child is kept, so the reach probabilities add up
    longest = run.acceptance == "typical"
    out = []
    for probs in run.accept_prob:
        reach = {(): 1.0}
        total = 1.0
        for p in wanted:  # Medusa order: parents first
            reach[p] = reach[p[:-1]] * (probs[index[p]] or 0.0)
            total = max(total, 1.0 + len(p) * (reach[p] > 0)) if longest else total + reach[p]
        out.append(total)
    return out


def expected_step_start(choices: Sequence[Sequence[int]], runs: Sequence[Run]) -> float:
    values = [v for r in runs for v in step_start_values(choices, r)]
    if not values:
        raise ValueError("no logged Medusa steps to estimate from")
    return sum(values) / len(values)


@dataclass
class Estimate:
    value: float
    ci95: tuple[float, float] | None
    estimator: str
    runs: int
    positions: int

    def to_json(self) -> dict:
        return {"value": round(self.value, 4), "ci95": [round(x, 4) for x in self.ci95] if self.ci95 else None,
                "estimator": self.estimator, "runs": self.runs, "positions": self.positions}

    def describe(self) -> str:
        ci = f" (95% CI {self.ci95[0]:.2f}-{self.ci95[1]:.2f} over prompts)" if self.ci95 else ""
        return f"{self.value:.3f} tokens/step, {self.estimator} estimator on {self.runs} runs / {self.positions} steps{ci}"


MAX_BOOTSTRAP = 100_000  # resamples: a 95 % interval settles long before; more is only time


def check_samples(samples: object) -> None:
    if isinstance(samples, bool) or not isinstance(samples, int) or not 0 <= samples <= MAX_BOOTSTRAP:
        raise ValueError(f"samples must be an integer in [0, {MAX_BOOTSTRAP}] (bootstrap resamples), got {samples!r}")


def bootstrap(per_run: Sequence, stat: Callable[[Sequence], float], samples: int, seed: int) -> tuple[float, float] | None:
    """Percentile 95 % interval of stat over resamples of whole runs (prompts); None with fewer than two.
    Every caller (estimate, the dynamic and paired comparisons) goes through here, so the bound on
    resamples is checked here."""
    check_samples(samples)
    if len(per_run) < 2 or samples < 1:
        return None
    rng = random.Random(seed)
    vals = sorted(stat(rng.choices(per_run, k=len(per_run))) for _ in range(samples))
    return vals[int(0.025 * (samples - 1))], vals[int(0.975 * (samples - 1))]


def estimate(choices: Sequence[Sequence[int]], runs: Sequence[Run], estimator: str = "replay",
             samples: int = 1000, seed: int = 0, replay: Replay | None = None) -> Estimate:
    """One estimator's E with a bootstrap interval over runs. `replay`: a prebuilt Replay of `runs`."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; choose from {', '.join(ESTIMATORS)}")
    check_samples(samples)
    if estimator == "step-start":
        per_run = [step_start_values(choices, r) for r in runs]
        per_run = [v for v in per_run if v]
        if not per_run:
            raise ValueError("no logged Medusa steps to estimate from")

        def stat(rs):
            return sum(sum(v) for v in rs) / sum(len(v) for v in rs)

        return Estimate(stat(per_run), bootstrap(per_run, stat, samples, seed), estimator, len(per_run),
                        sum(len(v) for v in per_run))
    rp = replay or Replay(runs)
    tree = _tree_set(choices)
    positions = rp.tokens()
    if estimator == "replay":
        per_run = [x for x in rp.walk(tree) if x[0]]

        def stat(rs):
            return sum(t for t, _ in rs) / sum(s for _, s in rs)
    elif estimator == "position":
        per_run = [x for x in rp.lengths(tree) if x[1]]

        def stat(rs):
            return 1.0 + sum(a for a, _ in rs) / sum(n for _, n in rs)
    else:
        vecs = [r.vectors if isinstance(r, Run) else r for r in runs]
        per_run = [v for v in vecs if v]
        depth = max(len(p) for p in tree)

        def stat(rs):
            return expected_independent(choices, head_stats([v for r in rs for v in r], depth, topk=MAX_TOPK).accuracy())
    return Estimate(stat(per_run), bootstrap(per_run, stat, samples, seed), estimator, len(per_run), positions)
