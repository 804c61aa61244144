"""Plotly figures of decoding steps, runs and trees, for the app and the notebooks alike: every
function takes plain trace dicts (docs/trace-schema.md) or trees and returns a `go.Figure`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import plotly.graph_objects as go
from plotly.subplots import make_subplots

import trees

from .layout import FONT_PX, MIN_PLOT_WIDTH_PX, Box, Frame, place_labels, text_width_px, tidy_layout, tree_graph

COLORS = {"accepted": "#2ca02c", "rejected": "#d62728", "unreached": "#b0b0b0", "root": "#1f77b4", "ghost": "#ff7f0e"}
MARGIN = dict(l=20, r=20, t=64, b=44)
LAYER_PX = 110
GHOST_RANK = 10**6  # sorts after every real rank: the ghost is its parent's last child
NEXT_COLOR = "#ff7f0e"
EDITOR_PLOT_WIDTH_PX = 560  # the editor's plot shares the row with the JSON editor
HEAD_TOKEN_CHARS = 12  # the head panel's token labels: longer tokens are cut, with '…'
HEAD_TICK_PX = 10  # their font size, and the bars' labels'


def token_label(text: str, limit: int = 8) -> str:
    t = text.replace("\n", "⏎").replace(" ", "·").replace("\t", "⇥")
    return t if len(t) <= limit else t[: limit - 1] + "…"


def _fmt(x) -> str:
    return "–" if x is None else f"{x:.3f}"


# -- one step -------------------------------------------------------------------------------------
def node_status(trace: dict) -> list[str]:
    """Per node: root / accepted / rejected (its parent was accepted, it was not) / unreached."""
    accepted = set(trace["accepted_nodes"])
    out = []
    for i, par in enumerate(trace.get("parent") or [-1]):
        if i == 0:
            out.append("root")
        elif i in accepted:
            out.append("accepted")
        elif par in accepted:
            out.append("rejected")
        else:
            out.append("unreached")
    return out


def node_rows(trace: dict) -> list[dict]:
    """One row per tree node with everything the hover and the node table show."""
    parents = trace.get("parent") or [-1]
    paths = [()] + [tuple(p) for p in trace["tree"]]
    status = node_status(trace)
    texts = trace.get("node_text") or [trace["accepted_text"]]
    heads = trace.get("head_topk") or []
    rows, reach = [], {0: 1.0}
    for i, path in enumerate(paths):
        par = parents[i]
        head_p = None
        if path and len(path) <= len(heads) and path[-1] < len(heads[len(path) - 1]):
            head_p = heads[len(path) - 1][path[-1]]["prob"]
        reach[i] = reach[par] * (head_p if head_p is not None else 0.0) if i else 1.0
        target_txt = trace["target_argmax_text"][par] if par >= 0 and "target_argmax_text" in trace else None
        reason = ""
        if status[i] == "rejected":
            reason = f"target chose {target_txt!r} at the parent"
        elif status[i] == "unreached":
            reason = "an ancestor was rejected"
        rows.append({
            "node": i, "path": list(path), "depth": len(path), "head": len(path) - 1 if path else None,
            "rank": path[-1] if path else None, "token_text": texts[i] if i < len(texts) else "",
            "head_prob": head_p, "path_prob": round(reach[i], 6), "status": status[i], "target_at_parent": target_txt,
            "target_prob_at_parent": trace["target_argmax_prob"][par] if par >= 0 and "target_argmax_prob" in trace else None,
            "why": reason,
        })
    return rows


@dataclass(frozen=True)
class TreeView:
    """How a step's tree is drawn: nodes whose path probability under the heads is below
    `min_path_prob` are pruned (the accepted path and its siblings always stay), and the subtrees
    of `collapsed` paths are folded into their root."""

    min_path_prob: float = 0.02
    show_all: bool = False
    collapsed: frozenset = field(default_factory=frozenset)


def _kept_nodes(rows: list[dict], trace: dict, view: TreeView) -> tuple[set[int], dict[int, int]]:
    """-> (nodes drawn, hidden descendants of each collapsed node drawn)."""
    parents = trace.get("parent") or [-1]
    accepted = set(trace["accepted_nodes"])
    keep = set()
    for r in rows:
        i = r["node"]
        if view.show_all or r["status"] == "root" or i in accepted or parents[i] in accepted or \
                r["path_prob"] >= view.min_path_prob:
            keep.add(i)
    for i in list(keep):  # prefix-closed: every kept node's ancestors too
        while i > 0:
            i = parents[i]
            keep.add(i)
    folded: dict[int, int] = {}
    by_path = {tuple(r["path"]): r["node"] for r in rows}
    for p in view.collapsed:
        u = by_path.get(tuple(p))
        if u is None or u not in keep:
            continue
        hidden = [r["node"] for r in rows if len(r["path"]) > len(p) and tuple(r["path"][: len(p)]) == tuple(p)]
        folded[u] = len(hidden)
        keep -= set(hidden)
    return keep, folded


def _frame(max_depth: int, height: int, width: int) -> Frame:
    return Frame(-0.03, 1.03, -(max_depth + 0.6), 0.45, width - MARGIN["l"] - MARGIN["r"], height - MARGIN["t"] - MARGIN["b"])


def _draw_tree(fig: go.Figure, paths: list[tuple], node_style: dict[int, dict], edge_style, labels: dict[int, str],
               label_rank: dict[int, float], edge_labels: bool, height: int, width: int = MIN_PLOT_WIDTH_PX
               ) -> dict[int, tuple[float, float]]:
    """Lay out and draw a tree whose node i+1 is paths[i]: edges grouped by style, markers grouped by
    `node_style[i]['group']`, labels and rank labels placed without overlap on a plot at least `width`
    px wide. -> positions."""
    g = tree_graph(paths)
    pos = tidy_layout(g)
    depth = max((len(p) for p in paths), default=0)
    frame = _frame(depth, height, width)
    groups: dict[tuple, tuple[list, list]] = {}
    for u, v in g.edges:
        st = edge_style(u, v)
        xs, ys = groups.setdefault(st, ([], []))
        xs += [pos[u][0], pos[v][0], None]
        ys += [pos[u][1], pos[v][1], None]
    for (name, color, width, dash), (xs, ys) in groups.items():
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", name=name, showlegend=bool(name),
                                 line=dict(width=width, color=color, dash=dash)))
    by_group: dict[str, list[int]] = {}
    for n in sorted(g.nodes):
        by_group.setdefault(node_style[n]["group"], []).append(n)
    leaves = sum(1 for n in g.nodes if g.out_degree(n) == 0)
    spacing = frame.width / max(leaves - 1, 1)  # px between neighbouring leaves on the narrowest plot
    cap = max(5.0, min(22.0, 0.9 * spacing))  # markers of a dense layer shrink instead of piling up
    for name, members in by_group.items():
        st = node_style[members[0]]
        fig.add_trace(go.Scatter(
            x=[pos[n][0] for n in members], y=[pos[n][1] for n in members], mode="markers", name=name,
            marker=dict(size=[min(cap, node_style[n]["size"]) for n in members],
                        color=[node_style[n]["color"] for n in members],
                        symbol=st.get("symbol", "circle"), line=dict(width=1, color="#333"),
                        **({k: st[k] for k in ("colorscale", "cmin", "cmax", "colorbar", "showscale") if k in st})),
            customdata=members, hovertext=[node_style[n]["hover"] for n in members], hoverinfo="text"))
    # labels: token text below each node, rank at each edge's middle; most important first
    boxes, texts, where, order_key = [], [], [], []
    for n, text in labels.items():
        x, y = pos[n][0], pos[n][1] - frame.dy(15)
        px, py = frame.px(x, y)
        boxes.append(Box(px, py, text_width_px(text), FONT_PX * 1.35))
        texts.append(text)
        where.append((x, y, FONT_PX))
        order_key.append(label_rank.get(n, 0.0))
    if edge_labels:
        for u, v in g.edges:
            r = g.nodes[v]["path"][-1]
            if r >= GHOST_RANK:
                continue
            x, y = (pos[u][0] + pos[v][0]) / 2, (pos[u][1] + pos[v][1]) / 2
            px, py = frame.px(x, y)
            text = f"r{r}"
            boxes.append(Box(px, py, text_width_px(text, FONT_PX - 2), (FONT_PX - 2) * 1.35))
            texts.append(text)
            where.append((x, y, FONT_PX - 2))
            order_key.append(-1.0 + label_rank.get(v, 0.0) / 10)
    kept = place_labels(boxes, sorted(range(len(boxes)), key=lambda i: -order_key[i]))
    for size in (FONT_PX, FONT_PX - 2):
        chosen = [i for i in kept if where[i][2] == size]
        if chosen:
            fig.add_trace(go.Scatter(x=[where[i][0] for i in chosen], y=[where[i][1] for i in chosen], mode="text",
                                     text=[texts[i] for i in chosen], textfont=dict(size=size, color="#222" if size ==
                                     FONT_PX else "#777"), hoverinfo="skip", showlegend=False,
                                     name="labels" if size == FONT_PX else "ranks"))
    fig.update_layout(height=height, margin=MARGIN, plot_bgcolor="white", dragmode="pan",
                      xaxis=dict(visible=False, range=[frame.x0, frame.x1]),
                      yaxis=dict(visible=False, range=[frame.y0, frame.y1]),
                      legend=dict(orientation="h", yanchor="top", y=-0.01, x=0, font=dict(size=10)))
    return pos


def tree_height(depth: int) -> int:
    return MARGIN["t"] + MARGIN["b"] + LAYER_PX * (depth + 1)


def step_tree_figure(trace: dict, view: TreeView = TreeView()) -> go.Figure:
    """A step's candidate tree: accepted path bold green, rejected red, unreached grey; at each accepted
    node whose children missed the target's choice, a ghost child (orange ring) shows what the target
    chose; token labels where they fit (hover for the rest), the rank on each edge."""
    rows = node_rows(trace)
    keep, folded = _kept_nodes(rows, trace, view)
    accepted = set(trace["accepted_nodes"])
    parents = trace.get("parent") or [-1]
    drawn = sorted(keep)
    index = {old: new for new, old in enumerate(drawn)}
    paths = [tuple(rows[n]["path"]) for n in drawn[1:]]
    style, labels, rank = {}, {}, {}
    for old in drawn:
        r = rows[old]
        n = index[old]
        hover = [f"<b>{r['token_text']!r}</b> node {old} path {r['path']}"]
        if r["head"] is not None:
            hover.append(f"head {r['head']} rank {r['rank']}: head p={_fmt(r['head_prob'])}, path p={_fmt(r['path_prob'])}")
            hover.append(f"target at parent: {r['target_at_parent']!r} (p={_fmt(r['target_prob_at_parent'])})")
        hover.append(r["status"] + (f": {r['why']}" if r["why"] else ""))
        if old in folded:
            hover.append(f"collapsed: {folded[old]} nodes hidden")
        style[n] = {"group": r["status"] if old not in folded else "collapsed",
                    "color": COLORS[r["status"]], "size": 9 + 12 * math.sqrt(r["head_prob"] or 1.0),
                    "symbol": "circle" if old not in folded else "diamond", "hover": "<br>".join(hover)}
        labels[n] = token_label(r["token_text"]) + (f" +{folded[old]}" if old in folded else "")
        rank[n] = 3.0 if old in accepted else 2.0 if r["status"] == "rejected" else r["path_prob"]
    # ghost children: what the target chose where the drafted children did not have it
    node_tokens = trace.get("node_tokens") or []
    argmax = trace.get("target_argmax") or []
    for old in sorted(accepted):
        if old >= len(argmax) or old not in index:
            continue
        kids = [i for i, p in enumerate(parents) if p == old]
        if any(node_tokens[i] == argmax[old] for i in kids if i in accepted):
            continue
        paths.append(tuple(rows[old]["path"]) + (GHOST_RANK,))
        n = len(paths)
        text = trace["target_argmax_text"][old] if "target_argmax_text" in trace else str(argmax[old])
        last = old == trace["accepted_nodes"][-1]
        style[n] = {"group": "target's token (ghost)", "color": COLORS["ghost"], "size": 13, "symbol": "circle-open-dot",
                    "hover": f"<b>{text!r}</b>: the target's choice after node {old}" +
                             (" (the next step's root)" if last else " (no drafted child had it)")}
        labels[n] = token_label(text)
        rank[n] = 2.5
    ghost_first = len(drawn)

    def edge(u, v):
        if v >= ghost_first:
            return ("target's token", COLORS["ghost"], 1.5, "dot")
        a, b = drawn[u], drawn[v]
        if a in accepted and b in accepted:
            return ("accepted path", COLORS["accepted"], 5, "solid")
        return ("", "#999", 1, "solid")

    fig = go.Figure()
    depth = max((len(p) for p in paths), default=0)
    _draw_tree(fig, paths, style, edge, labels, rank, True, tree_height(depth))
    kept_tokens = len(trace["accepted_tokens"])
    title = (f"step {trace['step']}: +{kept_tokens} token(s) {token_label(trace['accepted_text'], 40)!r}"
             f" · {len(rows) - 1} nodes, {len(drawn) - 1} drawn")
    if kept_tokens < len(trace["accepted_nodes"]):  # the run ended inside this step's path
        title += f"<br>({len(trace['accepted_nodes'])} accepted; the rest fell past EOS or the token limit)"
    fig.update_layout(title=dict(text=title, font=dict(size=14), x=0.01, y=0.98))
    return fig


def tree_figure(choices: Sequence[Sequence[int]], reach: Sequence[float] | None = None, colour_title: str = "") -> go.Figure:
    """A tree being edited: node labels are ranks; with `reach` (probability that a step keeps each
    non-root node, from an estimator), nodes are coloured by it and a colour bar names it."""
    paths = [tuple(p) for p in trees.validate(choices, topk=trees.MAX_TOPK)] if choices else []
    depth = max((len(p) for p in paths), default=0)
    probs = [1.0] + (list(reach) if reach is not None else [None] * len(paths))
    style, labels, rank = {}, {}, {}
    for n in range(len(paths) + 1):
        p = probs[n]
        hover = "root" if n == 0 else f"path {list(paths[n - 1])} (head {len(paths[n - 1]) - 1}, rank {paths[n - 1][-1]})"
        if p is not None and n:
            hover += f"<br>{colour_title or 'P(reached)'}: {p:.3f}"
        style[n] = {"group": "nodes", "color": p if p is not None else 0.5, "size": 13, "hover": hover,
                    "colorscale": "Viridis", "cmin": 0, "cmax": 1, "showscale": reach is not None,
                    "colorbar": dict(title=dict(text=colour_title or "P(reached)", side="right"), thickness=12)}
        labels[n] = "root" if n == 0 else f"r{paths[n - 1][-1]}"
        rank[n] = p if p is not None else -len(paths[n - 1]) if n else 9
    fig = go.Figure()
    _draw_tree(fig, paths, style, lambda u, v: ("", "#999", 1, "solid"), labels, rank, False, tree_height(depth),
               EDITOR_PLOT_WIDTH_PX)
    fig.update_layout(title=dict(text=f"{len(paths)} nodes, depth {depth}", x=0.01), showlegend=False)
    return fig


def head_panel(trace: dict, next_tokens: Sequence[int], accuracy: Sequence[tuple[int, int]] | None = None,
               k: int = 10) -> go.Figure:
    """Per head, its top-k tokens as labelled horizontal bars; the token that really came next is
    orange and marked '◀ next' (visible at any bar size). `accuracy`: per head (hits, total) of
    top-1 so far in this run.

    The panel is redrawn at every step, with new tokens, so nothing in it is left for the browser to
    measure (issue 31: its draw was the page's slowest): each bar's label is a text point beside it,
    which Plotly places from the font size alone (a bar's outside label is measured to be placed,
    and Plotly's cache of measurements keys on the text, new at every step), and the margins are set
    here (automargin measured every tick label, then drew the figure again when they needed more
    room). The left margin fits the widest token label this panel can show, so it stays put from
    step to step; only a wider label, of wide characters, widens it."""
    heads = trace.get("head_topk") or []
    if not heads:
        return go.Figure().update_layout(title="no head top-k in this trace", height=120)
    titles = []
    for h in range(len(heads)):
        t = f"head {h} → token t+{h + 2}"
        if accuracy and h < len(accuracy) and accuracy[h][1]:
            hits, total = accuracy[h]
            t += f" · top-1 right {hits}/{total} = {hits / total:.2f} so far"
        titles.append(t)
    fig = make_subplots(rows=len(heads), cols=1, subplot_titles=titles, vertical_spacing=0.35 / max(len(heads), 1))
    # one x range for every head (so bars compare across heads), fitted to the largest bar plus its label
    top_p = max((c["prob"] for top in heads for c in top[:k]), default=1.0)
    x_max = min(1.25, max(0.1, 1.4 * top_p + 0.08))
    widest = text_width_px(f"{k - 1}: " + "x" * HEAD_TOKEN_CHARS, HEAD_TICK_PX)
    for h, top in enumerate(heads):
        top = top[:k]
        real = next_tokens[h] if h < len(next_tokens) else None
        ys = [f"{i}: {token_label(c['text'], HEAD_TOKEN_CHARS)}" for i, c in enumerate(top)]
        widest = max([widest] + [text_width_px(y, HEAD_TICK_PX) for y in ys])
        probs = [c["prob"] for c in top]
        marks = ["◀ next" if c["token"] == real else "" for c in top]
        fig.add_trace(go.Bar(
            x=probs, y=ys, orientation="h", showlegend=False,
            marker_color=[NEXT_COLOR if c["token"] == real else "#4c78a8" for c in top],
            hovertext=[f"head {h} rank {i}: {c['text']!r} p={c['prob']:.4f}" + (" ← came next" if c["token"] == real else "")
                       for i, c in enumerate(top)], hoverinfo="text"), row=h + 1, col=1)
        # the no-break space keeps the label off the bar's end (a text point has no padding of its own)
        fig.add_trace(go.Scatter(x=probs, y=ys, mode="text", text=[f"\u00a0{p:.2f} {m}".rstrip() for p, m in zip(probs, marks)],
                                 textposition="middle right", textfont=dict(size=HEAD_TICK_PX), cliponaxis=False,
                                 hoverinfo="skip", showlegend=False), row=h + 1, col=1)
        fig.update_yaxes(autorange="reversed", automargin=False, row=h + 1, col=1, tickfont=dict(size=HEAD_TICK_PX))
        fig.update_xaxes(range=[0, x_max], automargin=False, row=h + 1, col=1, showticklabels=h == len(heads) - 1)
    fig.update_layout(height=70 + len(heads) * (16 * k + 40), margin=dict(l=math.ceil(widest) + 8, r=10, t=40, b=30),
                      title=dict(text="heads' top-k this step (orange ◀ next: the token that came)", font=dict(size=13)))
    return fig


def next_tokens(traces: Sequence[dict], step: int) -> list[int]:
    """The tokens that came after step `step`'s root (what each head should have predicted)."""
    stream_from = [t for s in traces[step:] for t in s["accepted_tokens"]]
    k = len(traces[step].get("head_topk") or [])
    return stream_from[1 : 1 + k]


# -- a run ----------------------------------------------------------------------------------------
def run_chart(per_step: Sequence[int], selected: int | None = None) -> go.Figure:
    """Tokens committed per step, the running mean and its 95 % interval (normal approximation over
    steps; neighbouring steps are correlated, so read it as a lower bound on the uncertainty)."""
    n = len(per_step)
    xs = list(range(n))
    mean, lo, hi = [], [], []
    s = s2 = 0.0
    for i, v in enumerate(per_step, 1):
        s, s2 = s + v, s2 + v * v
        m = s / i
        sd = math.sqrt(max(s2 / i - m * m, 0.0) * i / max(i - 1, 1))
        half = 1.96 * sd / math.sqrt(i) if i > 1 else 0.0
        mean.append(m)
        lo.append(m - half)
        hi.append(m + half)
    fig = go.Figure([
        go.Bar(x=xs, y=list(per_step), name="tokens this step", marker_color="#9ecae1"),
        go.Scatter(x=xs + xs[::-1], y=hi + lo[::-1], fill="toself", fillcolor="rgba(31,119,180,0.15)",
                   line=dict(width=0), name="95% interval", hoverinfo="skip"),
        go.Scatter(x=xs, y=mean, name="running mean", mode="lines", line=dict(color="#1f77b4")),
    ])
    if selected is not None and 0 <= selected < n:
        fig.add_vline(x=selected, line_color=NEXT_COLOR, line_width=2)
    title = f"tokens per step: {mean[-1]:.2f} ± {(hi[-1] - lo[-1]) / 2:.2f} over {n} steps" if n else "tokens per step"
    fig.update_layout(title=title, xaxis_title="step", height=280, margin=dict(l=10, r=10, t=40, b=10),
                      legend=dict(orientation="h", y=1.12))
    return fig


def acceptance_heatmap(accepted: Sequence[int], depth: int, max_columns: int = 200) -> go.Figure:
    """The Medusa paper's view: for each depth (head), the share of steps whose accepted path reached
    it, over the run (steps binned into at most `max_columns` columns)."""
    n = len(accepted)
    per = max(1, math.ceil(n / max_columns))
    cols = list(range(0, n, per))
    z = [[sum(a >= d for a in accepted[c : c + per]) / len(accepted[c : c + per]) for c in cols] for d in range(1, depth + 1)]
    rates = [sum(a >= d for a in accepted) / n if n else 0 for d in range(1, depth + 1)]
    fig = go.Figure(go.Heatmap(z=z, x=cols, y=[f"depth {d} ({rates[d - 1]:.0%})" for d in range(1, depth + 1)],
                               colorscale="Greens", zmin=0, zmax=1, colorbar=dict(title="reached", thickness=10)))
    fig.update_layout(title="accepted depth over the run (share of steps reaching each head's depth)",
                      xaxis_title="step" + (f" (bins of {per})" if per > 1 else ""), height=90 + 30 * max(depth, 1),
                      margin=dict(l=10, r=10, t=40, b=10))
    return fig


def head_accuracy_figure(stats: trees.HeadStats, ranks: int = 10) -> go.Figure:
    acc = stats.accuracy()
    fig = go.Figure()
    for k, row in enumerate(acc):
        lo_hi = [stats.interval(k, r) for r in range(min(ranks, len(row)))]
        fig.add_trace(go.Bar(x=list(range(len(lo_hi))), y=row[:ranks], name=f"head {k} (n={stats.totals[k]})",
                             error_y=dict(type="data", symmetric=False, array=[hi - a for (lo, hi), a in zip(lo_hi, row)],
                                          arrayminus=[a - lo for (lo, hi), a in zip(lo_hi, row)])))
    fig.update_layout(title="head accuracy by rank (95% Wilson intervals)", xaxis_title="rank", barmode="group",
                      height=300, margin=dict(l=10, r=10, t=40, b=10))
    return fig


def calibration_figure(traces: Sequence[dict], bins: int = 10) -> go.Figure:
    """Head probability of each top-k candidate vs how often it was the token that came next."""
    hits, counts, probs = [0] * bins, [0] * bins, [0.0] * bins
    stream = [t for s in traces for t in s["accepted_tokens"]]
    pos = 0
    for s in traces:
        truth = stream[pos + 1 : pos + 1 + len(s.get("head_topk") or [])]
        for h, top in enumerate(s.get("head_topk") or []):
            if h >= len(truth):
                break
            for c in top:
                b = min(int(c["prob"] * bins), bins - 1)
                counts[b] += 1
                probs[b] += c["prob"]
                hits[b] += c["token"] == truth[h]
        pos += len(s["accepted_tokens"])
    xs = [probs[b] / counts[b] for b in range(bins) if counts[b]]
    ys = [hits[b] / counts[b] for b in range(bins) if counts[b]]
    fig = go.Figure([go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="perfect", line=dict(dash="dot")),
                     go.Scatter(x=xs, y=ys, mode="lines+markers", name="heads")])
    fig.update_layout(title="calibration", xaxis_title="head probability", yaxis_title="observed frequency",
                      height=300, margin=dict(l=10, r=10, t=40, b=10))
    return fig


def size_curve_figure(curve: Sequence[dict]) -> go.Figure:
    """Replayed E(n) and predicted tokens/s against tree size (trees.select_size's curve)."""
    n = [c["nodes"] for c in curve]
    fig = go.Figure([go.Scatter(x=n, y=[c["expected"] for c in curve], name="E(n) tokens/step", mode="lines+markers"),
                     go.Scatter(x=n, y=[c["tokens_per_s"] for c in curve], name="predicted tokens/s", yaxis="y2",
                                mode="lines+markers")])
    fig.update_layout(title="tree size: tokens/step and predicted tokens/s (measured step times)", xaxis_title="nodes",
                      height=300, yaxis2=dict(overlaying="y", side="right"), margin=dict(l=10, r=10, t=40, b=10))
    return fig
