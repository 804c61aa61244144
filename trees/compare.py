"""Paired comparisons on the same prompts: tree A against tree B, and static against dynamic trees.

Two trees scored on the same prompts are compared prompt by prompt: a prompt that is easy for A is
easy for B too, so the interval of B's gain over A resamples prompts *jointly* (the same prompts for
both in every resample). That interval is far narrower than the two separate intervals suggest, and
it is the one that says whether B beats A on prompts of this kind.

    gain = (tokens_B / steps_B) / (tokens_A / steps_A) - 1    pooled over prompts

Replays of AR traces are paired by construction (both trees walk the same runs); measured Medusa
runs of two trees are paired by their prompt's hash (trace headers, docs/trace-schema.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .dynamic import RULES as DYNAMIC_RULES
from .dynamic import dynamic_walk, rule_factors
from .estimate import Replay, bootstrap
from .optimize import best_tree
from .stats import Run
from .tree import MAX_TOPK, validate

Walk = Sequence[tuple[int, int]]  # per prompt: (tokens, steps)


@dataclass
class Paired:
    """B against A on the same prompts."""

    a: float  # pooled tokens/step of A
    b: float  # of B
    gain: float  # b / a - 1
    ci95: tuple[float, float] | None  # of gain: percentile bootstrap over prompts, resampled jointly
    prompts: int
    b_better: int  # prompts where B took fewer steps per token than A
    a_better: int

    def to_json(self) -> dict:
        return {"a_tokens_per_step": round(self.a, 4), "b_tokens_per_step": round(self.b, 4),
                "gain_pct": round(100 * self.gain, 2),
                "gain_pct_ci95": [round(100 * x, 2) for x in self.ci95] if self.ci95 else None,
                "prompts": self.prompts, "b_better": self.b_better, "a_better": self.a_better}


def _rate(walk: Walk) -> float:
    return sum(t for t, _ in walk) / sum(s for _, s in walk)


def paired(a: Walk, b: Walk, samples: int = 1000, seed: int = 0) -> Paired:
    """Compare per-prompt (tokens, steps) of A and B, prompt i of one against prompt i of the other.

    >>> p = paired([(10, 5), (10, 4)], [(10, 4), (10, 4)], samples=0)
    >>> round(p.gain, 3), p.b_better, p.a_better
    (0.125, 1, 0)
    """
    if len(a) != len(b):
        raise ValueError(f"a paired comparison needs the same prompts on both sides, got {len(a)} and {len(b)}")
    pairs = [(x, y) for x, y in zip(a, b) if x[1] and y[1]]
    if not pairs:
        raise ValueError("no prompt with steps on both sides to compare")

    def gain(ps) -> float:
        return _rate([y for _, y in ps]) / _rate([x for x, _ in ps]) - 1

    better = [(y[0] / y[1]) - (x[0] / x[1]) for x, y in pairs]
    return Paired(_rate([x for x, _ in pairs]), _rate([y for _, y in pairs]), gain(pairs),
                  bootstrap(pairs, gain, samples, seed), len(pairs), sum(d > 0 for d in better),
                  sum(d < 0 for d in better))


def compare_trees(runs: Sequence[Run], tree_a: Sequence[Sequence[int]], tree_b: Sequence[Sequence[int]],
                  samples: int = 1000, seed: int = 0, replay: Replay | None = None) -> Paired:
    """Tree B against tree A, both replayed on the same AR traces (greedy)."""
    rp = replay or Replay(runs)
    walk_a, walk_b = (rp.walk({tuple(p) for p in validate(t, topk=MAX_TOPK)}) for t in (tree_a, tree_b))
    return paired(walk_a, walk_b, samples, seed)


def prompt_key(run: Run) -> str | None:
    """The hash of a run's prompt token ids from its trace header (a batched run's header lists one
    per request), or None for traces written before headers carried it."""
    h = run.header.get("prompt_sha256")
    if isinstance(h, list):
        h = h[run.request] if run.request < len(h) else None
    return h if isinstance(h, str) else None


def pair_measured(a: Sequence[Run], b: Sequence[Run]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(tokens, steps) of the measured runs of two trees, matched prompt by prompt through their prompt
    hashes; prompts run by only one side are left out."""
    keys_a, keys_b = [prompt_key(r) for r in a], [prompt_key(r) for r in b]
    if None in keys_a or None in keys_b:
        raise ValueError("these Medusa traces carry no prompt hash (written before headers had prompt_sha256): "
                         "their runs cannot be paired prompt by prompt")
    by_key = {k: (r.n_tokens, r.n_steps) for k, r in zip(keys_b, b)}
    shared = [(k, r) for k, r in zip(keys_a, a) if k in by_key]
    if not shared:
        raise ValueError("the two trees' Medusa traces share no prompt")
    return [(r.n_tokens, r.n_steps) for _, r in shared], [by_key[k] for k, _ in shared]


def static_vs_dynamic(test: Sequence[Run], sizes: Sequence[int], tune: Sequence[Run] | None = None,
                      rules: Sequence[str] = DYNAMIC_RULES, samples: int = 1000, seed: int = 0, topk: int = 10,
                      max_depth: int | None = None, time_limit: float | None = 30.0) -> list[dict]:
    """Static against dynamic trees of equal node counts, replayed on the AR traces `test`.

    At each size n: the static tree is the replay optimum of n nodes on `tune` (on `test` itself when
    no tune traces are given: then the static figure is in-sample and flatters it); each dynamic rule
    drafts n nodes per step ('calibrated' is fitted on `tune`, else on `test`). Every dynamic figure is
    a paired comparison against the static tree on the test prompts. -> one dict per size:
    {"nodes", "static": {"tokens_per_step", "tree"}, "dynamic": {rule: Paired.to_json()}, "in_sample"}.
    """
    if not test:
        raise ValueError("no AR traces to compare on")
    tuning = tune or test
    rp = Replay(test)
    factors = {rule: rule_factors(rule, tuning, topk) for rule in rules}
    out = []
    for n in sizes:
        tree = best_tree(tuning, n, "replay", topk, max_depth, time_limit=time_limit)
        static = rp.walk({tuple(p) for p in tree})
        row = {"nodes": n, "static": {"tokens_per_step": round(_rate(static), 4), "tree": tree}, "dynamic": {},
               "in_sample": tune is None}
        for rule, f in factors.items():
            row["dynamic"][rule] = paired(static, dynamic_walk(test, n, f, max_depth, rp), samples, seed).to_json()
        out.append(row)
    return out
