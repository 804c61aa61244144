"""Tidy top-down layout of an ordered tree: leaves left to right in depth-first rank order, each
parent centred over its first and last child. Ordered subtrees occupy disjoint x-intervals, so no
two edges cross."""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx


def tree_graph(paths: Sequence[Sequence[int]]) -> nx.DiGraph:
    """Node 0 is the root, node i+1 is paths[i] (Medusa's order when paths come from trees.validate)."""
    g = nx.DiGraph()
    g.add_node(0, path=())
    index = {(): 0}
    for i, p in enumerate(paths, 1):
        p = tuple(p)
        index[p] = i
        g.add_node(i, path=p)
        g.add_edge(index[p[:-1]], i)
    return g


def tidy_layout(g: nx.DiGraph, root: int = 0) -> dict[int, tuple[float, float]]:
    """Positions {node: (x, y)}, y = -depth, leaves one unit apart."""
    pos: dict[int, tuple[float, float]] = {}
    next_x = [0.0]

    def children(u):
        return sorted(g.successors(u), key=lambda v: g.nodes[v]["path"])

    def place(u, depth):  # recursion depth = tree depth, at most the number of heads
        kids = children(u)
        if not kids:
            pos[u] = (next_x[0], -float(depth))
            next_x[0] += 1.0
            return
        for v in kids:
            place(v, depth + 1)
        pos[u] = ((pos[kids[0]][0] + pos[kids[-1]][0]) / 2, -float(depth))

    place(root, 0)
    return pos
