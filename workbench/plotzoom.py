"""Plotly figures as Gradio plot values that the mouse wheel zooms, whose zoom survives a redraw, and
whose old drawings the page lets go of.

Gradio draws a plot value with `Plotly.react(div, data, layout, config)`, taking `config` from the
value's JSON: `scrollZoom` makes the wheel zoom the plot instead of scrolling the page.

But this Gradio (6.x) mounts a fresh div for every new value of a gr.Plot (a `{#key}` block around
the plot) and never calls `Plotly.purge` on the old one. Two consequences, both fixed by PLOT_JS in
the page's <head>, which wraps `Plotly.react` once Gradio's lazily loaded plotly bundle sets
`window.Plotly`:
- a leak: each old div kept its `responsive` window 'resize' listener, which held its whole SVG
  (about 1,800 DOM nodes and 300 listeners a step selected on the Decode tab, issue 31). The
  wrapper purges the div a plot's block drew last when it draws a new one there, once that div's
  own drawing has ended: Plotly's draw reads the div's layout as it ends, and a div purged before
  then threw an uncaught TypeError (`_redrawFromAutoMarginCount`) per figure at every step selected.
- the zoom reset: `layout.uirevision` keeps the user's view only when Plotly redraws the same div.
  The wrapper does the same across divs: when the old and new figure share a `uirevision`, every
  axis the user zoomed or panned (Plotly's `_preGUI` record) keeps the range it showed.

A third cost is Plotly's arrival: Gradio imports its 4.6 MB plotly bundle when the first figure
comes, which in a fresh browser made a 1.3 s main-thread task at the end of the first run (issue
31), and Plotly's first draw of a kind of trace is slower than later ones. `warmup_plot` draws a
tiny figure of every trace kind the Decode tab shows, off-screen, as the page loads, so both happen
then; PLOT_JS purges that drawing once it is made.
"""

from __future__ import annotations

import json

import gradio as gr
import plotly.graph_objects as go
from gradio.components.plot import PlotData
from plotly.subplots import make_subplots

CONFIG = {"scrollZoom": True, "displaylogo": False}
WARMUP_ID = "plotly-warmup"
# off-screen, yet laid out at a real size: Plotly rejects drawing in a hidden (display: none) div
WARMUP_CSS = f"#{WARMUP_ID} {{ position: fixed !important; left: -10000px; top: 0; width: 600px; }}\n"

PLOT_JS = """<script>
(() => {
  const drawn = new WeakMap();  // a gr.Plot's block element -> {gd: the div Plotly last drew in it, done: that draw}
  function keepView(old, layout) {  // uirevision across Gradio's fresh divs: user-set axis ranges stay
    const full = old._fullLayout;
    if (!full || !old.layout || old.layout.uirevision == null || old.layout.uirevision !== layout.uirevision) return;
    for (const key of Object.keys(full._preGUI || {})) {
      const name = (key.match(/^([xy]axis\\d*)\\./) || [])[1], axis = name && full[name];
      if (axis && !axis.autorange && Array.isArray(axis.range))
        layout[name] = Object.assign({}, layout[name], {range: axis.range.slice(), autorange: false});
    }
  }
  function wrap(Plotly) {
    if (!Plotly || Plotly.__workbench) return Plotly;
    const react = Plotly.react;
    Plotly.react = function (gd, data, layout, config) {
      const block = gd instanceof Element ? gd.closest('.block') : null;
      const last = block && drawn.get(block);
      if (last && last.gd !== gd) {
        if (layout && typeof layout === 'object') keepView(last.gd, layout);
        // purged once its own drawing has ended: Plotly's draw reads the div's layout when it ends
        last.done.then(() => Plotly.purge(last.gd), () => Plotly.purge(last.gd));
      }
      const entry = {gd, done: Promise.resolve()};  // recorded first: a draw that throws is still purged later
      if (block) drawn.set(block, entry);
      const done = entry.done = Promise.resolve(react.apply(this, arguments));
      if (gd instanceof Element && gd.closest('#__WARMUP_ID__'))  // warmed: its drawing is let go of
        done.then(() => { Plotly.purge(gd); gd.dataset.warmed = 'purged'; });
      return done;
    };
    Plotly.__workbench = true;
    return Plotly;
  }
  let current = wrap(window.Plotly);
  Object.defineProperty(window, 'Plotly', {configurable: true, get: () => current, set: (p) => { current = wrap(p); }});
})();
</script>""".replace("__WARMUP_ID__", WARMUP_ID)


def zoomable(fig: go.Figure, revision: str) -> PlotData:
    """`fig` for a gr.Plot: wheel zoom on, and the view kept while `revision` stays the same."""
    fig.update_layout(uirevision=revision)
    value = json.loads(fig.to_json())
    value["config"] = CONFIG
    return PlotData(type="plotly", plot=json.dumps(value))


def warmup_figure() -> go.Figure:
    """A tiny figure with every trace kind the Decode tab draws (horizontal bars labelled by text points
    under subplot titles, lines, a filled band, markers with text, a heatmap), for the first draw."""
    fig = make_subplots(rows=3, cols=1, subplot_titles=["bars", "lines", "heatmap"])
    fig.add_trace(go.Bar(x=[0.6, 0.3], y=["a", "b"], orientation="h", hovertext=["a", "b"], hoverinfo="text"),
                  row=1, col=1)
    fig.add_trace(go.Scatter(x=[0.6, 0.3], y=["a", "b"], mode="text", text=["0.60", "0.30"], textposition="middle right",
                             cliponaxis=False, hoverinfo="skip"), row=1, col=1)
    fig.add_trace(go.Bar(x=[0, 1], y=[2, 1]), row=2, col=1)
    fig.add_trace(go.Scatter(x=[0, 1, 1, 0], y=[1, 2, 1, 0], fill="toself"), row=2, col=1)
    fig.add_trace(go.Scatter(x=[0, 1], y=[1, 2], mode="lines+markers+text", text=["a", "b"]), row=2, col=1)
    fig.add_trace(go.Heatmap(z=[[0, 1], [1, 0]]), row=3, col=1)
    fig.update_layout(height=360, showlegend=False)
    return fig


def warmup_plot() -> gr.Plot:
    """The off-screen plot that warms Plotly as the page loads (WARMUP_CSS places it, PLOT_JS purges it)."""
    return gr.Plot(zoomable(warmup_figure(), "warmup"), show_label=False, container=False, elem_id=WARMUP_ID)
