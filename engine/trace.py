"""Step traces: one JSON object per decoding step (schema_version 1, see DESIGN.md).

Built only when asked for, from tensors the step already has, so recording costs nothing when off.
The writer flushes every line, so a killed run keeps every step it finished.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from typing import IO

import torch

from .decode import StepResult

TRACE_SCHEMA_VERSION = 1


def step_trace(
    step: int,
    prefix_len: int,
    tree: list[list[int]],
    res: StepResult,
    parent: list[int],
    topk: int,
    step_ms: float,
    decode: Callable[[int], str],
) -> dict:
    """Everything the UI and the statistics need to replay one step."""
    committed = res.tokens
    record = {
        "step": step,
        "prefix_len": prefix_len,
        "tree": tree,
        "accepted_nodes": res.accepted_nodes,
        "accepted_tokens": committed,
        "accepted_text": "".join(decode(t) for t in committed),
        "step_ms": round(step_ms, 4),
    }
    if res.node_logits is not None:
        probs = torch.softmax(res.node_logits.float(), dim=-1)  # [T, V] target at temperature 1
        argmax_p, argmax = probs.max(-1)
        node_tokens = res.node_tokens.tolist() if res.node_tokens is not None else committed[:1]
        record["node_tokens"] = node_tokens
        record["node_text"] = [decode(t) for t in node_tokens]
        record["target_argmax"] = argmax.tolist()
        record["target_argmax_text"] = [decode(t) for t in record["target_argmax"]]
        record["target_argmax_prob"] = [round(p, 6) for p in argmax_p.tolist()]
        # probability the target gave each node's token at the node's parent (the root: unknown here)
        record["target_prob"] = [
            None if par < 0 else round(float(probs[par, tok]), 6) for tok, par in zip(node_tokens, parent)
        ]
    if res.head_logits is not None:
        hp = torch.softmax(res.head_logits.float(), dim=-1)
        vals, idx = hp.topk(min(topk, hp.shape[-1]), dim=-1)
        record["head_topk"] = [
            [{"token": int(t), "text": decode(int(t)), "prob": round(float(p), 6)} for t, p in zip(ti, pi)]
            for ti, pi in zip(idx.tolist(), vals.tolist())
        ]
    return record


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
        self._f: IO[str] = open(path, "a", encoding="utf-8")

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
