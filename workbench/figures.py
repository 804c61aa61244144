"""Plotly figures of decoding steps, runs and trees. Used by the app and the notebooks alike; every
function takes plain trace dicts or trees and returns a `plotly.graph_objects.Figure`."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

import trees

from .layout import tidy_layout, tree_graph

COLORS = {"accepted": "#2ca02c", "rejected": "#d62728", "unreached": "#b0b0b0", "root": "#1f77b4"}


def node_status(trace: dict) -> list[str]:
    """Per node: root / accepted / rejected (its parent was accepted, it was not) / unreached."""
    accepted = set(trace["accepted_nodes"])
    parents = trees.buffers(trace["tree"]).parent.tolist() if trace["tree"] else [-1]
    out = []
    for i, par in enumerate(parents):
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
    paths = [()] + [tuple(p) for p in trees.validate(trace["tree"])] if trace["tree"] else [()]
    parents = trees.buffers(trace["tree"]).parent.tolist() if trace["tree"] else [-1]
    status = node_status(trace)
    texts = trace.get("node_text") or [trace["accepted_text"]]
    heads = trace.get("head_topk") or []
    rows = []
    cum = {0: 1.0}
    for i, path in enumerate(paths):
        par = parents[i]
        head_p = None
        if path and len(path) <= len(heads) and path[-1] < len(heads[len(path) - 1]):
            head_p = heads[len(path) - 1][path[-1]]["prob"]
        cum[i] = cum.get(par, 1.0) * (head_p if head_p is not None else 1.0) if i else 1.0
        target_tok = trace["target_argmax"][par] if par >= 0 and "target_argmax" in trace else None
        target_txt = None
        if target_tok is not None:
            target_txt = trace["target_argmax_text"][par] if "target_argmax_text" in trace else f"<{target_tok}>"
        reason = ""
        if status[i] == "rejected":
            reason = f"target chose {target_txt!r} at the parent"
        elif status[i] == "unreached":
            reason = "an ancestor was rejected"
        rows.append({
            "node": i, "path": list(path), "depth": len(path), "head": len(path) - 1 if path else None,
            "rank": path[-1] if path else None, "token_text": texts[i] if i < len(texts) else "",
            "head_prob": head_p, "path_prob": round(cum[i], 6), "status": status[i],
            "target_at_parent": target_txt,
            "target_prob_at_parent": trace["target_argmax_prob"][par] if par >= 0 and "target_argmax_prob" in trace else None,
            "why": reason,
        })
    return rows


def step_tree_figure(trace: dict, min_path_prob: float = 0.0, max_labels: int = 64) -> go.Figure:
    """The step's candidate tree: accepted path bold green, rejected red, unreached grey.

    Nodes whose cumulative head probability is below `min_path_prob` are pruned (with their
    subtrees) so large trees stay readable; at most `max_labels` nodes get a text label.
    """
    rows = node_rows(trace)
    keep = {r["node"] for r in rows if r["path_prob"] >= min_path_prob or r["status"] in ("root", "accepted")}
    paths = [r["path"] for r in rows[1:]]
    g = tree_graph(paths)
    drop = [n for n in g.nodes if n not in keep or any(a not in keep for a in _ancestors(g, n))]
    g.remove_nodes_from(drop)
    pos = tidy_layout(g)
    accepted = set(trace["accepted_nodes"])
    fig = go.Figure()
    for bold in (False, True):
        xs, ys = [], []
        for u, v in g.edges:
            if (u in accepted and v in accepted) == bold:
                xs += [pos[u][0], pos[v][0], None]
                ys += [pos[u][1], pos[v][1], None]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", name="accepted path" if bold else "edges",
                                 line=dict(width=5 if bold else 1, color=COLORS["accepted"] if bold else "#999")))
    nodes = sorted(g.nodes)
    by_status: dict[str, list[int]] = {}
    for n in nodes:
        by_status.setdefault(rows[n]["status"], []).append(n)
    labelled = set(sorted(nodes, key=lambda n: -rows[n]["path_prob"])[:max_labels])
    for status, members in by_status.items():
        fig.add_trace(go.Scatter(
            x=[pos[n][0] for n in members], y=[pos[n][1] for n in members], mode="markers+text", name=status,
            text=[_label(rows[n]["token_text"]) if n in labelled else "" for n in members], textposition="bottom center",
            marker=dict(size=[10 + 20 * (rows[n]["head_prob"] or 1.0) ** 0.5 for n in members], color=COLORS[status],
                        line=dict(width=1, color="#333")),
            customdata=[n for n in members], hovertext=[_hover(rows[n]) for n in members], hoverinfo="text"))
    title = f"step {trace['step']}: accepted {len(trace['accepted_tokens'])} token(s) {trace['accepted_text']!r}"
    if len(trace["accepted_tokens"]) < len(trace["accepted_nodes"]):  # the run ended inside this step's path
        title += f" (of {len(trace['accepted_nodes'])}; the rest fell past EOS or the token limit)"
    fig.update_layout(title=title, showlegend=True, height=420, margin=dict(l=10, r=10, t=40, b=10),
                      xaxis=dict(visible=False), yaxis=dict(visible=False), plot_bgcolor="white")
    return fig


def _ancestors(g, n):
    out = []
    while True:
        preds = list(g.predecessors(n))
        if not preds:
            return out
        n = preds[0]
        out.append(n)


def _label(text: str) -> str:
    t = text.replace("\n", "⏎").replace(" ", "·")
    return t if len(t) <= 8 else t[:7] + "…"


def _hover(r: dict) -> str:
    lines = [f"<b>{r['token_text']!r}</b> node {r['node']} path {r['path']}"]
    if r["head"] is not None:
        lines.append(f"head {r['head']} rank {r['rank']}, head p={_fmt(r['head_prob'])}, path p={_fmt(r['path_prob'])}")
        lines.append(f"target at parent: {r['target_at_parent']!r} (p={_fmt(r['target_prob_at_parent'])})")
    lines.append(r["status"] + (f": {r['why']}" if r["why"] else ""))
    return "<br>".join(lines)


def _fmt(x) -> str:
    return "–" if x is None else f"{x:.3f}"


def head_topk_figure(trace: dict, k: int = 10) -> go.Figure:
    """Each head's top-k probabilities this step; the bar of the token that really came next is marked."""
    heads = trace.get("head_topk") or []
    fig = go.Figure()
    truth = trace.get("_next_tokens") or []
    for h, top in enumerate(heads):
        real = truth[h] if h < len(truth) else None
        fig.add_trace(go.Bar(
            x=[f"h{h}:{_label(c['text'])}·{i}" for i, c in enumerate(top[:k])], y=[c["prob"] for c in top[:k]], name=f"head {h}",
            marker_line=dict(width=[3 if c["token"] == real else 0 for c in top[:k]], color="black"),
            hovertext=[f"head {h} rank {i}: {c['text']!r} p={c['prob']:.3f}" + (" ← came next" if c["token"] == real else "")
                       for i, c in enumerate(top[:k])], hoverinfo="text"))
    fig.update_layout(title="heads' top-k (outlined: the token that came next)", barmode="group", height=320,
                      margin=dict(l=10, r=10, t=40, b=10), xaxis=dict(showticklabels=False))
    return fig


def with_next_tokens(traces: Sequence[dict]) -> list[dict]:
    """Annotate each step with the tokens that came after its root (for marking the truth)."""
    stream = [t for s in traces for t in s["accepted_tokens"]]
    out, pos = [], 0
    for s in traces:
        k = len(s.get("head_topk") or [])
        out.append({**s, "_next_tokens": stream[pos + 1 : pos + 1 + k]})
        pos += len(s["accepted_tokens"])
    return out


def run_figure(traces: Sequence[dict]) -> go.Figure:
    """Tokens committed per step over the run, with the running mean."""
    per = [len(s["accepted_tokens"]) for s in traces]
    mean = [sum(per[: i + 1]) / (i + 1) for i in range(len(per))]
    fig = go.Figure([go.Bar(x=list(range(len(per))), y=per, name="tokens this step"),
                     go.Scatter(x=list(range(len(per))), y=mean, name="running mean", mode="lines")])
    fig.update_layout(title="tokens per step", xaxis_title="step", height=280, margin=dict(l=10, r=10, t=40, b=10))
    return fig


def accepted_histogram(traces: Sequence[dict]) -> go.Figure:
    per = [len(s["accepted_tokens"]) for s in traces]
    fig = go.Figure(go.Histogram(x=per, xbins=dict(start=0.5, end=max(per, default=1) + 0.5, size=1)))
    fig.update_layout(title="tokens per step (histogram)", height=280, margin=dict(l=10, r=10, t=40, b=10))
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
    for s in with_next_tokens(traces):
        for h, top in enumerate(s.get("head_topk") or []):
            if h >= len(s["_next_tokens"]):
                break
            for c in top:
                b = min(int(c["prob"] * bins), bins - 1)
                counts[b] += 1
                probs[b] += c["prob"]
                hits[b] += c["token"] == s["_next_tokens"][h]
    xs = [probs[b] / counts[b] for b in range(bins) if counts[b]]
    ys = [hits[b] / counts[b] for b in range(bins) if counts[b]]
    fig = go.Figure([go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="perfect", line=dict(dash="dot")),
                     go.Scatter(x=xs, y=ys, mode="lines+markers", name="heads")])
    fig.update_layout(title="calibration", xaxis_title="head probability", yaxis_title="observed frequency",
                      height=300, margin=dict(l=10, r=10, t=40, b=10))
    return fig


def tree_figure(choices: Sequence[Sequence[int]], acc: Sequence[Sequence[float]] | None = None) -> go.Figure:
    """A tree being edited; with head accuracies, each node shows its predicted path probability."""
    paths = [list(p) for p in trees.validate(choices)] if choices else []
    g = tree_graph(paths)
    pos = tidy_layout(g)
    probs = [1.0] + [trees.path_probability(p, acc) if acc else None for p in paths]
    xs, ys = [], []
    for u, v in g.edges:
        xs += [pos[u][0], pos[v][0], None]
        ys += [pos[u][1], pos[v][1], None]
    fig = go.Figure(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color="#999", width=1), hoverinfo="skip", showlegend=False))
    nodes = sorted(g.nodes)
    fig.add_trace(go.Scatter(
        x=[pos[n][0] for n in nodes], y=[pos[n][1] for n in nodes], mode="markers", showlegend=False,
        marker=dict(size=14, color=[probs[n] if probs[n] is not None else 0.5 for n in nodes], colorscale="Viridis",
                    cmin=0, cmax=1, showscale=acc is not None, colorbar=dict(title="P(path)")),
        hovertext=["root" if n == 0 else f"path {paths[n - 1]}" + (f"<br>P(path)={probs[n]:.3f}" if probs[n] is not None else "")
                   for n in nodes], hoverinfo="text"))
    title = f"{len(paths)} nodes, depth {max((len(p) for p in paths), default=0)}"
    if acc:
        title += f", predicted E = {trees.expected_independent(paths, acc):.3f} tokens/step"
    fig.update_layout(title=title, height=380, xaxis=dict(visible=False), yaxis=dict(visible=False),
                      plot_bgcolor="white", margin=dict(l=10, r=10, t=40, b=10))
    return fig


def size_curve_figure(curve: Sequence[dict]) -> go.Figure:
    """E(n) and predicted tokens/s against tree size (from trees.select_size's curve)."""
    n = [c["nodes"] for c in curve]
    fig = go.Figure([go.Scatter(x=n, y=[c["expected"] for c in curve], name="E(n) tokens/step", mode="lines+markers"),
                     go.Scatter(x=n, y=[c["tokens_per_s"] for c in curve], name="tokens/s", yaxis="y2", mode="lines+markers")])
    fig.update_layout(title="tree size: tokens/step and tokens/s", xaxis_title="nodes", height=300,
                      yaxis2=dict(overlaying="y", side="right"), margin=dict(l=10, r=10, t=40, b=10))
    return fig
