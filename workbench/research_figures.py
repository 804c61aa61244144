"""Figures of the research views: static vs dynamic trees and recorded batch sweeps (Compare), and two
saved runs side by side (Runs). Kept apart from figures.py, which draws the Decode tab's live views."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")


def static_vs_dynamic_figure(rows: Sequence[dict]) -> go.Figure:
    """Tokens/step against node count: the static tree, and each dynamic rule with its paired 95 %
    interval (the gain's interval applied to the static figure)."""
    nodes = [r["nodes"] for r in rows]
    fig = go.Figure(go.Scatter(x=nodes, y=[r["static"]["tokens_per_step"] for r in rows], name="static (replay optimum)",
                               mode="lines+markers", line=dict(color="#444")))
    rules = list(rows[0]["dynamic"]) if rows else []
    for i, rule in enumerate(rules):
        d = [r["dynamic"][rule] for r in rows]
        y = [x["b_tokens_per_step"] for x in d]
        lo = [x["a_tokens_per_step"] * (1 + x["gain_pct_ci95"][0] / 100) if x["gain_pct_ci95"] else v for x, v in zip(d, y)]
        hi = [x["a_tokens_per_step"] * (1 + x["gain_pct_ci95"][1] / 100) if x["gain_pct_ci95"] else v for x, v in zip(d, y)]
        fig.add_scatter(x=nodes, y=y, name=f"dynamic: {rule}", mode="lines+markers", line=dict(color=COLOURS[i % 4]),
                        error_y=dict(type="data", symmetric=False, array=[h - v for h, v in zip(hi, y)],
                                     arrayminus=[v - lo_ for v, lo_ in zip(y, lo)]))
    fig.update_layout(title="static vs dynamic trees at equal node counts (replayed, paired 95 % intervals)",
                      xaxis=dict(title="nodes", type="log"), yaxis_title="tokens / step", height=380,
                      margin=dict(l=50, r=20, t=50, b=40), legend=dict(orientation="h", y=-0.2))
    return fig


def tokens_per_step_over_time(runs: Sequence[tuple[str, Sequence[int]]]) -> go.Figure:
    """Each run's tokens per step and their running mean, step by step."""
    fig = go.Figure()
    for i, (name, per_step) in enumerate(runs):
        mean, total = [], 0
        for k, n in enumerate(per_step, 1):
            total += n
            mean.append(total / k)
        c = COLOURS[i % 4]
        fig.add_scatter(y=list(per_step), name=f"{name}: per step", mode="markers", marker=dict(color=c, size=4),
                        opacity=0.45)
        fig.add_scatter(y=mean, name=f"{name}: running mean", mode="lines", line=dict(color=c))
    fig.update_layout(title="tokens per step over the run", xaxis_title="step", yaxis_title="tokens / step",
                      height=340, margin=dict(l=50, r=20, t=50, b=40), legend=dict(orientation="h", y=-0.25))
    return fig


def head_accuracy_over_time(runs: Sequence[tuple[str, Sequence[Sequence[float | None]]]]) -> go.Figure:
    """Each head's top-1 accuracy so far, step by step (solid: the first run, dashed: the second)."""
    fig = go.Figure()
    for i, (name, per_step) in enumerate(runs):
        heads = max((len(s) for s in per_step), default=0)
        for h in range(heads):
            y = [s[h] if h < len(s) else None for s in per_step]
            fig.add_scatter(y=y, name=f"{name}: head {h + 1}", mode="lines",
                            line=dict(color=COLOURS[h % 4], dash="solid" if i == 0 else "dash"))
    fig.update_layout(title="per-head top-1 accuracy so far", xaxis_title="step", yaxis=dict(title="accuracy", range=[0, 1]),
                      height=340, margin=dict(l=50, r=20, t=50, b=40), legend=dict(orientation="h", y=-0.25))
    return fig


def batch_sweep_figure(sweep: dict) -> go.Figure:
    """A recorded batch sweep (workbench/sweeps.py): tokens/s of AR and each tree against the batch size,
    and each tree over AR, with the break-even line: where Medusa stops paying."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("tokens/s", "Medusa over our AR"))
    b = sweep["batches"]
    fig.add_scatter(x=b, y=sweep["ar"], name="our AR", mode="lines+markers", line=dict(color="#444"), row=1, col=1)
    shorts = [name.rsplit("/", 1)[-1] for name in sweep["trees"]]
    unique = len(set(shorts)) == len(shorts)  # two folders' tree_64.json keep their paths, or they share a legend entry
    for i, (name, tps) in enumerate(sweep["trees"].items()):
        c = COLOURS[i % 4]
        short = shorts[i] if unique else name
        ratio = [None if v is None else v / a for v, a in zip(tps, sweep["ar"])]
        fig.add_scatter(x=b, y=tps, name=short, mode="lines+markers", line=dict(color=c), legendgroup=short,
                        row=1, col=1)
        fig.add_scatter(x=b, y=ratio, name=short, mode="lines+markers", line=dict(color=c), legendgroup=short,
                        showlegend=False, row=1, col=2)
    fig.add_hline(y=1.0, line=dict(color="#888", dash="dash"), row=1, col=2)
    fig.update_xaxes(title_text="batch size", type="log", tickvals=b, ticktext=[str(x) for x in b])
    fig.update_yaxes(type="log", dtick=1, row=1, col=1)  # powers of ten: the minor labels crowd a short range
    fig.update_layout(title=f"batch sweep: {sweep['title']}", height=380, margin=dict(l=50, r=20, t=70, b=40),
                      legend=dict(orientation="h", y=-0.25))
    return fig
