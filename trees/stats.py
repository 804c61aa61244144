"""Runs and head statistics from step traces (the JSON lines `python -m engine ... --trace` writes).

A trace file holds runs: a header line, then one line per step (docs/trace-schema.md). Each line is
checked as it is read, and a bad one is an error naming the file and line. A `Run` keeps only what
the estimators read: per step the committed tokens, each head's top-k token ids and probabilities
(the dynamic-tree replay builds each step's tree from them), the accepted node count, and (Medusa
runs) the acceptance rule's per-node probabilities.

The key quantity per AR step is its rank vector: for head k, the rank at which the token that
really came next (k+1 places after the step's root) sat in head k's top-k, or None. Under greedy
decoding a tree path is accepted exactly when it is a prefix of the step's rank vector.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from .io import JsonInputError, open_for_reading, parse_json
from .tree import MAX_DEPTH

RankVector = list[int | None]
MAX_TRACE_LINE = 8 * 2**20  # one step of a 511-node tree with texts is well under 1 MB


class TraceError(ValueError):
    """A trace file or trace line that cannot be used; the message names the file and line."""


@dataclass
class Run:
    """One decoded prompt, as its trace recorded it."""

    header: dict = field(default_factory=dict)
    tokens: list[list[int]] = field(default_factory=list)  # committed per step
    head_tokens: list[list[list[int]]] = field(default_factory=list)  # per step, per head: top-k ids
    head_probs: list[list[list[float | None]]] = field(default_factory=list)  # per step, per head: their probabilities
    accepted: list[int] = field(default_factory=list)  # accepted tree nodes per step (root included)
    accept_prob: list[list[float | None]] = field(default_factory=list)  # per step, per node (when recorded)
    tree: list[list[int]] | None = None  # the tree the run decoded with (Medusa runs)
    request: int = 0  # its index in a batched run (the header's per-request lists)
    _vectors: list[RankVector] | None = None

    @property
    def n_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def n_steps(self) -> int:
        return len(self.tokens)

    @property
    def mode(self) -> str:
        return self.header.get("mode") or ("medusa" if self.tree else "ar")

    @property
    def acceptance(self) -> str:
        # runs saved by older versions of the app name it `accept`, not the schema's `acceptance`
        return self.header.get("acceptance") or self.header.get("accept") or "greedy"

    @property
    def vectors(self) -> list[RankVector]:
        if self._vectors is None:
            self._vectors = rank_vectors_of(self.tokens, self.head_tokens)
        return self._vectors

    def add_step(self, step: dict) -> None:
        """Append one step-trace dict (checked: TraceError names what is wrong)."""
        tokens, head_tokens, head_probs, accepted, probs, tree = _step(step)
        if tree and self.tree and tree != self.tree:
            raise TraceError("the steps of one run name different trees")
        nodes = len(tree or self.tree or []) + 1
        if probs is not None and len(probs) != nodes:
            raise TraceError(f"'accept_prob' has {len(probs)} entries; the run's tree has {nodes} nodes with the root")
        if (tree or self.tree) and accepted > nodes:
            raise TraceError(f"{accepted} accepted nodes; the run's tree has {nodes} nodes with the root")
        self.tokens.append(tokens)
        self.head_tokens.append(head_tokens)
        self.head_probs.append(head_probs)
        self.accepted.append(accepted)
        if probs is not None:
            self.accept_prob.append(probs)
        if tree:
            self.tree = tree
        self._vectors = None


def _ints(x: object, what: str) -> list[int]:
    if not isinstance(x, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in x):
        raise TraceError(f"{what} must be a list of integers")
    return x


def _probability(p: object) -> bool:
    return isinstance(p, (int, float)) and not isinstance(p, bool) and 0 <= p <= 1


def _step(obj: dict) -> tuple[list[int], list[list[int]], list[list[float | None]], int, list | None, list | None]:
    """Check one step record and keep what the estimators read."""
    tokens = _ints(obj.get("accepted_tokens"), "'accepted_tokens'")
    nodes = obj.get("accepted_nodes", [0] * max(1, len(tokens)))
    _ints(nodes, "'accepted_nodes'")
    heads = obj.get("head_topk") or []
    if not isinstance(heads, list) or len(heads) > MAX_DEPTH:
        raise TraceError("'head_topk' must be a list of at most one list per head")
    head_tokens, head_probs = [], []
    for h in heads:
        if not isinstance(h, list) or not all(isinstance(c, dict) and isinstance(c.get("token"), int) for c in h):
            raise TraceError("'head_topk' entries must be lists of {'token': int, ...}")
        if not all(c.get("prob") is None or _probability(c["prob"]) for c in h):
            raise TraceError("'head_topk' probabilities must be numbers in [0, 1]")
        head_tokens.append([c["token"] for c in h])
        head_probs.append([c.get("prob") for c in h])
    probs = obj.get("accept_prob")
    if probs is not None and (not isinstance(probs, list) or not all(p is None or _probability(p) for p in probs)):
        raise TraceError("'accept_prob' must be a list of probabilities (null for the root)")
    tree = obj.get("tree")
    if tree is not None and not (isinstance(tree, list) and all(isinstance(p, list) for p in tree)):
        raise TraceError("'tree' must be a list of paths")
    for p in tree or []:
        _ints(p, "each path of 'tree'")
    return tokens, head_tokens, head_probs, len(nodes), probs, tree


def iter_trace_lines(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """(line number, object) of every non-empty line, each checked to be a JSON object. Lines are
    read one at a time, each no further than MAX_TRACE_LINE characters: a file without newlines
    costs that much memory, not its size."""
    try:
        f = open_for_reading(path)
    except JsonInputError as e:
        raise TraceError(str(e)) from None
    with f:
        n = 0
        try:
            while line := f.readline(MAX_TRACE_LINE + 1):
                n += 1
                if len(line) > MAX_TRACE_LINE:
                    raise TraceError(f"{path}:{n}: a line longer than {MAX_TRACE_LINE} characters")
                if not line.strip():
                    continue
                try:
                    obj = parse_json(line, f"{path}:{n}", MAX_TRACE_LINE)
                except JsonInputError as e:
                    raise TraceError(str(e)) from None
                if not isinstance(obj, dict):
                    raise TraceError(f"{path}:{n}: a trace line must be a JSON object")
                yield n, obj
        except UnicodeDecodeError:
            raise TraceError(f"{path}: not UTF-8 text") from None
        except OSError as e:
            raise TraceError(f"{path}: cannot read ({e.strerror or e})") from None


def read_runs(path: str | os.PathLike) -> list[Run]:
    """Every run of a trace file. A header line, or a step numbered 0, starts a run; a batched run's
    steps (with a `request` field) are split per request."""
    runs: list[Run] = []
    by_request: dict[int, Run] = {}
    header: dict = {}
    for n, obj in iter_trace_lines(path):
        if obj.get("type") == "header":
            header, by_request = obj, {}
            continue
        if "accepted_tokens" not in obj:
            raise TraceError(f"{path}:{n}: neither a header nor a step (no 'accepted_tokens')")
        req = obj.get("request", 0)
        if not isinstance(req, int) or isinstance(req, bool):
            raise TraceError(f"{path}:{n}: 'request' must be an integer")
        run = by_request.get(req)
        if run is None or obj.get("step") == 0 and run.tokens:
            run = by_request[req] = Run(header=header, request=req)
            runs.append(run)
        try:
            run.add_step(obj)
        except TraceError as e:
            raise TraceError(f"{path}:{n}: {e}") from None
    return [r for r in runs if r.tokens]


def rank_vectors_of(tokens: Sequence[Sequence[int]], head_tokens: Sequence[Sequence[Sequence[int]]]) -> list[RankVector]:
    """Rank vectors of one run's steps (see the module docstring)."""
    stream: list[int] = []
    starts: list[int] = []
    for t in tokens:
        starts.append(len(stream))
        stream.extend(t)
    out: list[RankVector] = []
    for heads, start in zip(head_tokens, starts):
        vec: RankVector = []
        for k, top in enumerate(heads):
            pos = start + k + 1
            if pos >= len(stream):
                break  # the run ended before this head's target was produced: unknown, not wrong
            vec.append(top.index(stream[pos]) if stream[pos] in top else None)
        out.append(vec)
    return out


def rank_vectors(steps: Sequence[dict]) -> list[RankVector]:
    """Rank vectors of one run given as step-trace dicts (what the engine's stream yields)."""
    return rank_vectors_of([s["accepted_tokens"] for s in steps],
                           [[[c["token"] for c in h] for h in (s.get("head_topk") or [])] for s in steps])


def run_of_steps(steps: Sequence[dict], header: dict | None = None) -> Run:
    """A Run from step-trace dicts (the workbench keeps these in memory)."""
    run = Run(header=dict(header or {}))
    for s in steps:
        run.add_step(s)
    return run


def ar_runs(runs: Iterable[Run]) -> list[Run]:
    """The runs whose every step committed one token with the heads' top-k logged (AR traces): the
    input of the replay estimator and the optimiser."""
    return [r for r in runs if r.mode == "ar" and all(a == 1 for a in r.accepted) and any(r.head_tokens)]


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
