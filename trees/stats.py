"""Head statistics from step traces (the JSON lines the engine writes with --trace).

The key quantity per logged step is its rank vector: for head k, the rank at which the token that
really came next (k+1 places after the step's root) sat in head k's top-k, or None. Under greedy
decoding a tree path is accepted exactly when it is a prefix of the step's rank vector, so every
estimator and the empirical optimiser work from these vectors alone.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

RankVector = list[int | None]


def read_traces(path: str | os.PathLike) -> list[dict]:
    """All JSON objects of a trace file; a broken line is an error naming file and line."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
    return rows


def split_runs(rows: Iterable[dict]) -> list[list[dict]]:
    """Group step records into runs: a header, or a step numbered 0, starts a new run."""
    runs: list[list[dict]] = []
    for row in rows:
        if row.get("type") == "header":
            runs.append([])
            continue
        if "accepted_tokens" not in row:
            continue
        if not runs or (row.get("step") == 0 and runs[-1]):
            runs.append([])
        runs[-1].append(row)
    return [r for r in runs if r]


def rank_vectors(steps: Sequence[dict]) -> list[RankVector]:
    """Rank vectors of one run's steps (see the module docstring)."""
    stream: list[int] = []
    starts: list[int] = []
    for s in steps:
        starts.append(len(stream))
        stream.extend(s["accepted_tokens"])
    out: list[RankVector] = []
    for s, start in zip(steps, starts):
        vec: RankVector = []
        for k, top in enumerate(s.get("head_topk") or []):
            pos = start + k + 1
            if pos >= len(stream):
                break  # the run ended before this head's target was produced: unknown, not wrong
            tokens = [c["token"] for c in top]
            vec.append(tokens.index(stream[pos]) if stream[pos] in tokens else None)
        out.append(vec)
    return out


def rank_vectors_from_file(path: str | os.PathLike) -> list[RankVector]:
    return [v for run in split_runs(read_traces(path)) for v in rank_vectors(run)]


def wilson(successes: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (sane at 0 and at small counts)."""
    if total == 0:
        return (0.0, 1.0)
    p = successes / total
    den = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / den
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / den
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass
class HeadStats:
    """Per-head rank counts. counts[k][r]: steps where head k's rank-r candidate was right."""

    counts: list[list[int]]
    totals: list[int]  # steps where head k's target was known
    cond_counts: list[list[int]]  # same, only steps where heads 0..k-1 were all right within top-k
    cond_totals: list[int]
    topk: int

    @property
    def num_heads(self) -> int:
        return len(self.totals)

    def accuracy(self, conditional: bool = False) -> list[list[float]]:
        """head_accuracy[k][r]; conditional=True: given the path above it was correct."""
        c, t = (self.cond_counts, self.cond_totals) if conditional else (self.counts, self.totals)
        return [[x / t[k] if t[k] else 0.0 for x in c[k]] for k in range(self.num_heads)]

    def interval(self, k: int, r: int, conditional: bool = False) -> tuple[float, float]:
        c, t = (self.cond_counts, self.cond_totals) if conditional else (self.counts, self.totals)
        return wilson(c[k][r], t[k])

    def to_json(self) -> dict:
        return {
            "topk": self.topk,
            "totals": self.totals,
            "head_accuracy": self.accuracy(),
            "head_accuracy_conditional": self.accuracy(conditional=True),
            "counts": self.counts,
            "cond_counts": self.cond_counts,
            "cond_totals": self.cond_totals,
        }


def head_stats(vectors: Sequence[RankVector], num_heads: int | None = None, topk: int = 10) -> HeadStats:
    k_max = num_heads if num_heads is not None else max((len(v) for v in vectors), default=0)
    counts = [[0] * topk for _ in range(k_max)]
    cond = [[0] * topk for _ in range(k_max)]
    totals = [0] * k_max
    cond_totals = [0] * k_max
    for v in vectors:
        all_right = True
        for k, r in enumerate(v[:k_max]):
            totals[k] += 1
            if all_right:
                cond_totals[k] += 1
            if r is not None and r < topk:
                counts[k][r] += 1
                if all_right:
                    cond[k][r] += 1
            else:
                all_right = False
    return HeadStats(counts, totals, cond, cond_totals, topk)
