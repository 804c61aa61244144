"""The step record: one `StepEvent` per request and step, from the runner to the stream, the trace
file and the UI (trace schema 1, docs/trace-schema.md).

`decode.finish_step` reads a step's packed device tensor into one StepEvent per request: the
tokens it committed, the nodes it kept and, when the run is traced, what the step saw (computed on
the device by `decode.trace_fields`). The session cuts the tokens at EOS or the token limit, adds
the text they make and, when traced, the run's `TraceContext`. `StepEvent.to_json()` is then the
trace line: the trace file holds it, `StepEvent.trace` and `Result.traces` return it, and the app
draws from it. The writer flushes every line, so a killed run keeps every step it finished.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import IO

import torch

from .generation import GenerationError

TRACE_SCHEMA_VERSION = 1
MICRO = 1_000_000  # traced probabilities travel as integers in millionths (traces keep 6 decimals)


@dataclass(frozen=True)
class TraceContext:
    """What every step of one traced run shares."""

    tree: list[list[int]]  # the run's paths ([] for AR)
    parent: list[int]  # per node, root first: its parent (-1 for the root)
    token_text: Callable[[int], str]  # one token's text
    batched: bool = False  # steps name their request

    @cached_property
    def depth(self) -> list[int]:
        return [0] + [len(p) for p in self.tree]


@dataclass
class StepEvent:
    """One request's decoding step. Per-node lists are root first; the trace fields are None unless
    the run is traced."""

    tokens: list[int]  # committed this step, root first (cut at EOS / the token limit by the session)
    accepted_nodes: list[int]  # tree nodes kept, root (0) first; [0] for an AR step
    step: int = 0
    text: str = ""  # exactly the text this step added: joined over a run, the run's text
    step_ms: float = 0.0
    done: bool = False
    finish_reason: str | None = None  # "eos" | "length" on the last event
    request: int = 0  # index of the prompt in a batch
    prefix_len: int = 0  # committed tokens before the step, prompt included
    node_tokens: list[int] | None = None  # candidates verified (AR: the token fed)
    target_argmax: list[int] | None = None  # the target's choice after each node
    target_argmax_prob: list[float] | None = None  # its probability at temperature 1
    target_prob: list[float | None] | None = None  # the probability the target gave each node's token at its parent
    accept_prob: list[float | None] | None = None  # the chance the run's rule keeps the node once its parent is kept
    # the heads' top-k as the device packs it (decode.head_topk_fields): each head's `topk` ids in turn, then their
    # probabilities in millionths; read through `head_topk`, or straight into the trace line
    head_fields: list[int] = field(default_factory=list, repr=False)
    topk: int = 0  # candidates per head in head_fields
    context: TraceContext | None = field(default=None, repr=False)  # set on traced runs

    @property
    def head_topk(self) -> list[list[tuple[int, float]]]:
        """Per head, the (token, probability) pairs it drafted from, largest first ([] if none)."""
        f, k = self.head_fields, self.topk
        n = len(f) // 2
        return [[(t, p / MICRO) for t, p in zip(f[a: a + k], f[n + a: n + a + k])] for a in range(0, n, k)] if f else []

    @cached_property
    def trace(self) -> dict | None:
        """The step's trace line (docs/trace-schema.md), or None when the run is not traced."""
        return self.to_json() if self.context is not None else None

    def to_json(self) -> dict:
        run = self.context
        text = run.token_text
        rec = {
            "step": self.step,
            "prefix_len": self.prefix_len,
            "tree": run.tree,
            "parent": run.parent,
            "depth": run.depth,
            "accepted_nodes": self.accepted_nodes,
            "accepted_tokens": self.tokens,
            "accepted_text": "".join(map(text, self.tokens)),
            "step_ms": round(self.step_ms, 4),
            "node_tokens": self.node_tokens,
            "node_text": list(map(text, self.node_tokens)),
            "target_argmax": self.target_argmax,
            "target_argmax_text": list(map(text, self.target_argmax)),
            "target_argmax_prob": self.target_argmax_prob,
            "target_prob": self.target_prob,
            "accept_prob": self.accept_prob,
        }
        if self.head_fields:
            # one flat pass from the packed fields: on a traced AR step of the demo model (4 heads x 10) this was
            # a third of the host's tracing work when it went through head_topk's 40 tuples first
            f, k = self.head_fields, self.topk
            n = len(f) // 2
            ids = f[:n]
            cands = [{"token": t, "text": s, "prob": p / MICRO} for t, s, p in zip(ids, map(text, ids), f[n:])]
            rec["head_topk"] = [cands[a: a + k] for a in range(0, n, k)]
        if run.batched:
            rec["request"] = self.request
        return rec


def prompt_hash(ids: Sequence[int]) -> str:
    """sha256 of a prompt's token ids (comma-joined decimals): the key that pairs two trees' runs of
    the same prompt across trace files (trees.compare.pair_measured)."""
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()


def header(model: str, heads: str | None, tree: list[list[int]] | None, mode: str, accept: str, extra: dict) -> dict:
    return {
        "type": "header",
        "schema_version": TRACE_SCHEMA_VERSION,
        "model": model,
        "heads": heads,
        "tree": tree,
        "mode": mode,
        "acceptance": accept,
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        **extra,
    }


class TraceWriter:
    """JSON lines, flushed (and fsynced) per step."""

    def __init__(self, path: str | os.PathLike):
        self.path = path
        try:
            self._f: IO[str] = open(path, "a", encoding="utf-8")
        except IsADirectoryError:
            raise GenerationError(f"{path}: is a directory; the trace needs a file path") from None
        except OSError as e:
            raise GenerationError(f"{path}: cannot write the trace ({e.strerror or e})") from None

    def write(self, obj: dict) -> None:
        self._f.write(json.dumps(obj, ensure_ascii=False) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
