"""Tree layout and label placement for the tree views (no plotting here).

Layout: layered and tidy. Leaves are spread evenly over the whole width in depth-first rank
order, each parent centred over its first and last child, one layer per depth, so ordered subtrees
occupy disjoint x-intervals and no two edges cross. Labels: placed greedily by importance where
their text box (estimated from the characters, conservatively) overlaps no label already placed;
the rest are left to the hover. Boxes are computed for the narrowest plot the app draws
(MIN_PLOT_WIDTH_PX): on a wider screen the nodes only move further apart.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx

MIN_PLOT_WIDTH_PX = 900
FONT_PX = 11


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
    """Positions {node: (x, y)}: x in [0, 1] (leaves evenly spaced), y = -depth."""
    pos: dict[int, tuple[float, float]] = {}
    leaves: list[int] = []

    def children(u):
        return sorted(g.successors(u), key=lambda v: g.nodes[v]["path"])

    order = [(root, 0)]  # iterative depth-first walk (a tree of 511 nodes is shallow, but be safe)
    depth_of = {}
    while order:
        u, d = order.pop()
        depth_of[u] = d
        kids = children(u)
        if not kids:
            leaves.append(u)
        order.extend((v, d + 1) for v in reversed(kids))
    span = max(len(leaves) - 1, 1)
    for i, u in enumerate(leaves):
        pos[u] = (i / span if len(leaves) > 1 else 0.5, -float(depth_of[u]))
    for u in sorted(depth_of, key=lambda n: -depth_of[n]):  # deepest first: children are placed
        kids = children(u)
        if kids:
            pos[u] = ((pos[kids[0]][0] + pos[kids[-1]][0]) / 2, -float(depth_of[u]))
    return pos


def text_width_px(text: str, font_px: float = FONT_PX) -> float:
    """An upper estimate of a label's rendered width (wide East Asian characters and emoji count double)."""
    w = 0.0
    for ch in text:
        wide = unicodedata.east_asian_width(ch) in ("W", "F") or ord(ch) >= 0x1F000
        w += font_px * (1.25 if wide else 0.68)
    return w + 4


@dataclass
class Box:
    x: float  # centre, px
    y: float
    w: float
    h: float

    def overlaps(self, o: Box) -> bool:
        return abs(self.x - o.x) * 2 < self.w + o.w and abs(self.y - o.y) * 2 < self.h + o.h


def place_labels(boxes: Sequence[Box], order: Sequence[int]) -> list[int]:
    """Indices of the boxes kept, visiting them in `order` (most important first): a box is kept when
    it overlaps none kept before it."""
    kept: list[int] = []
    cells: dict[tuple[int, int], list[int]] = {}  # a coarse grid, so each box is checked against its neighbours
    size = 64.0
    for i in order:
        b = boxes[i]
        xs = range(int((b.x - b.w / 2) // size), int((b.x + b.w / 2) // size) + 1)
        ys = range(int((b.y - b.h / 2) // size), int((b.y + b.h / 2) // size) + 1)
        near = {j for cx in xs for cy in ys for j in cells.get((cx, cy), ())}
        if any(b.overlaps(boxes[j]) for j in near):
            continue
        kept.append(i)
        for cx in xs:
            for cy in ys:
                cells.setdefault((cx, cy), []).append(i)
    return kept


@dataclass
class Frame:
    """Data -> pixel mapping of a figure's plot area (plotly's layout, for label placement)."""

    x0: float
    x1: float
    y0: float
    y1: float
    width: float  # plot area, px
    height: float

    def px(self, x: float, y: float) -> tuple[float, float]:
        return ((x - self.x0) / (self.x1 - self.x0) * self.width, (self.y1 - y) / (self.y1 - self.y0) * self.height)

    def dy(self, pixels: float) -> float:
        """A vertical distance in data units."""
        return pixels * (self.y1 - self.y0) / self.height
