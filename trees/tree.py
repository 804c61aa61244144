"""Tree schema and validation: a `medusa_choices` tree is a list of paths of ranks.

`[0, 1]` means head 0's top-1 candidate, then head 1's second candidate beneath it.
The root (the base model's own next token) is implicit and never listed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Path = tuple[int, ...]
MAX_DEPTH = 64  # far beyond any head count in use; bounds the work a hostile tree can cause
MAX_NODES = 511  # candidates one step verifies, the root aside; a bigger step costs more than it can win
MAX_TOPK = 1024


class TreeError(ValueError):
    """A tree breaks one of the rules; the message names the path and the rule."""


def _as_path(raw: object, index: int) -> Path:
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
        raise TreeError(f"path #{index} {raw!r}: a path must be a list of integer ranks")
    if len(raw) == 0:
        raise TreeError(f"path #{index} []: a path must not be empty")
    out = []
    for r in raw:
        # bool is an int subclass; True as a rank is always a mistake.
        if isinstance(r, bool) or not isinstance(r, int):
            raise TreeError(f"path #{index} {list(raw)!r}: rank {r!r} is not an integer")
        out.append(int(r))
    return tuple(out)


def validate(choices: Iterable[object], topk: int = 10, num_heads: int | None = None) -> list[Path]:
    """Check every rule (docs/tree-format.md) and return the paths in Medusa's node order, sorted by
    (len, path). The one validator: the trees CLI, the engine, and the app's editor and save use it.

    >>> validate([[0, 0], [0], [1]])
    [(0,), (1,), (0, 0)]
    """
    if isinstance(choices, (str, bytes, dict)) or not isinstance(choices, Iterable):
        raise TreeError(f"a tree must be a list of paths, got {type(choices).__name__}")
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= MAX_TOPK:
        raise TreeError(f"topk must be an integer in [1, {MAX_TOPK}], got {topk!r}")
    if num_heads is not None and (isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1):
        raise TreeError(f"num_heads must be a positive integer, got {num_heads!r}")
    paths: list[Path] = []
    seen: set[Path] = set()
    for i, raw in enumerate(choices):
        if i >= MAX_NODES:
            raise TreeError(f"the tree has more than {MAX_NODES} nodes (the most one step verifies)")
        p = _as_path(raw, i)
        if len(p) > MAX_DEPTH:
            raise TreeError(f"path #{i}: depth {len(p)} exceeds the limit of {MAX_DEPTH}")
        for r in p:
            if not 0 <= r < topk:
                raise TreeError(f"path {list(p)}: rank {r} is outside [0, {topk})")
        if num_heads is not None and len(p) > num_heads:
            raise TreeError(f"path {list(p)}: depth {len(p)} exceeds the {num_heads} heads")
        if p in seen:
            raise TreeError(f"path {list(p)}: duplicate path")
        seen.add(p)
        paths.append(p)
    if not paths:
        raise TreeError("the tree is empty: it needs at least one path, e.g. [[0]]")
    for p in paths:
        for d in range(1, len(p)):
            if p[:d] not in seen:
                raise TreeError(f"path {list(p)}: its prefix {list(p[:d])} is missing")
    return sort_paths(paths)


def sort_paths(paths: Iterable[Path]) -> list[Path]:
    """Medusa's node order: shallower first, then lexicographic."""
    return sorted((tuple(p) for p in paths), key=lambda p: (len(p), p))


def depth(choices: Sequence[Sequence[int]]) -> int:
    return max((len(p) for p in choices), default=0)


def as_lists(paths: Iterable[Sequence[int]]) -> list[list[int]]:
    """JSON-friendly form of a tree."""
    return [list(p) for p in paths]
