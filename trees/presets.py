"""Named trees: Medusa's published tree, chains, full k-ary trees, and shipped tuned trees.

Every `trees/data/*.json` file joins the registry under its stem, so a tuned tree ships by
dropping its JSON there; `register` adds one at run time.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from pathlib import Path as FsPath

from .io import load_tree
from .tree import TreeError, as_lists, validate

DATA_DIR = FsPath(__file__).parent / "data"
DEFAULT_TREE = "demo_tuned"


def chain(depth: int) -> list[list[int]]:
    """The top-1 chain: one candidate per head (classic speculative decoding)."""
    return [[0] * d for d in range(1, depth + 1)]


def kary(branching: int, depth: int) -> list[list[int]]:
    """The full tree with `branching` ranks at every depth."""
    return [list(p) for d in range(1, depth + 1) for p in itertools.product(range(branching), repeat=d)]


_REGISTRY: dict[str, Callable[[], list[list[int]]]] = {}


def register(name: str, choices: list[list[int]] | Callable[[], list[list[int]]]) -> None:
    """Add a named tree: a function that makes its paths, or the paths (kept as checked; every `preset`
    call gets lists of its own, so a caller's edit never reaches the next one)."""
    _REGISTRY[name] = choices if callable(choices) else (lambda c=tuple(validate(choices)): as_lists(c))


for _d in range(1, 6):
    register(f"chain_{_d}", lambda d=_d: chain(d))
for _k, _d in [(2, 2), (2, 3), (3, 2), (3, 3), (4, 2)]:
    register(f"kary_{_k}x{_d}", lambda k=_k, d=_d: kary(k, d))


@functools.cache
def _shipped(path: FsPath) -> tuple[tuple[int, ...], ...]:
    """A shipped tree's paths, read once: reading and checking its file took some 2 ms a call, and the
    engine resolves the tree of every run (files outside trees/data are read at every use: they may change)."""
    return tuple(map(tuple, load_tree(path).medusa_choices))


for _f in sorted(DATA_DIR.glob("*.json")):
    register(_f.stem, lambda f=_f: as_lists(_shipped(f)))


def names() -> list[str]:
    return sorted(_REGISTRY)


def preset(name: str) -> list[list[int]]:
    if name not in _REGISTRY:
        raise TreeError(f"unknown tree preset {name!r}; known: {', '.join(names())}")
    return _REGISTRY[name]()
