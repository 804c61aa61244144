"""Step traces: one JSON object per decoding step (schema_version 1, docs/trace-schema.md).

The numbers come from the device already packed (`decode.trace_fields`); this module only names
them and adds token texts. The writer flushes every line, so a killed run keeps every step it
finished.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from typing import IO

import torch

from .decode import StepResult
from .generation import GenerationError

TRACE_SCHEMA_VERSION = 1


class Tracer:
    """Builds the trace record of each step of one run (the tree's shape is fixed for the run)."""

    def __init__(self, tree: list[list[int]], parent: list[int], text_of: Callable[[int], str],
                 writer: TraceWriter | None = None):
        self.tree, self.parent, self.text_of, self.writer = tree, parent, text_of, writer
        self.depth = [0] + [len(p) for p in tree]

    def record(self, step: int, prefix_len: int, res: StepResult, committed: list[int], step_ms: float,
               request: int | None = None) -> dict:
        """Everything the UI and the statistics need to replay one step. `committed`: the tokens the
        output kept (res.tokens cut at EOS or the token limit)."""
        text = self.text_of
        rec = {
            "step": step,
            "prefix_len": prefix_len,
            "tree": self.tree,
            "parent": self.parent,
            "depth": self.depth,
            "accepted_nodes": res.accepted_nodes,
            "accepted_tokens": committed,
            "accepted_text": "".join(text(t) for t in committed),
            "step_ms": round(step_ms, 4),
        }
        tr = res.trace
        if tr is not None:
            rec["node_tokens"] = tr.node_tokens
            rec["node_text"] = [text(t) for t in tr.node_tokens]
            rec["target_argmax"] = tr.target_argmax
            rec["target_argmax_text"] = [text(t) for t in tr.target_argmax]
            rec["target_argmax_prob"] = tr.target_argmax_prob
            rec["target_prob"] = tr.target_prob
            rec["accept_prob"] = tr.accept_prob
            if tr.head_topk:
                rec["head_topk"] = [[{"token": t, "text": text(t), "prob": p} for t, p in head] for head in tr.head_topk]
        if request is not None:
            rec["request"] = request
        if self.writer is not None:
            self.writer.write(rec)
        return rec


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
