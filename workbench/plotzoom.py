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
  wrapper purges the div a plot's block drew last when it draws a new one there.
- the zoom reset: `layout.uirevision` keeps the user's view only when Plotly redraws the same div.
  The wrapper does the same across divs: when the old and new figure share a `uirevision`, every
  axis the user zoomed or panned (Plotly's `_preGUI` record) keeps the range it showed.
"""

from __future__ import annotations

import json

import plotly.graph_objects as go
from gradio.components.plot import PlotData

CONFIG = {"scrollZoom": True, "displaylogo": False}

PLOT_JS = """<script>
(() => {
  const drawn = new WeakMap();  // a gr.Plot's block element -> the div Plotly last drew in it
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
      const old = block && drawn.get(block);
      if (old && old !== gd) {
        if (layout && typeof layout === 'object') keepView(old, layout);
        Plotly.purge(old);
      }
      if (block) drawn.set(block, gd);
      return react.apply(this, arguments);
    };
    Plotly.__workbench = true;
    return Plotly;
  }
  let current = wrap(window.Plotly);
  Object.defineProperty(window, 'Plotly', {configurable: true, get: () => current, set: (p) => { current = wrap(p); }});
})();
</script>"""


def zoomable(fig: go.Figure, revision: str) -> PlotData:
    """`fig` for a gr.Plot: wheel zoom on, and the view kept while `revision` stays the same."""
    fig.update_layout(uirevision=revision)
    value = json.loads(fig.to_json())
    value["config"] = CONFIG
    return PlotData(type="plotly", plot=json.dumps(value))
