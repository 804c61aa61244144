"""Figures and tables as files a paper or another program can use.

Figures: SVG (vector, for papers), PNG at print size (PRINT_INCHES at PRINT_DPI) and standalone HTML
(plotly.js inlined, so it works offline). The images are drawn by kaleido with the system's Chromium,
one kept per process for every figure (figure_browser.py); without a Chromium the image formats are
skipped with one line saying so, and the HTML still comes.
Tables: CSV for spreadsheets and JSON records that every standard parser reads, so a missing or
non-finite number is an empty cell / `null`, never `NaN` (which `JSON.parse` rejects).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Sequence

import plotly.graph_objects as go
import plotly.io as pio

from . import figure_browser
from .browser import CHROMIUM, have_chromium

PRINT_INCHES = (7.0, 4.5)  # a full-width figure in a two-column paper
PRINT_DPI = 300
LAYOUT_PX = (700, 450)  # the figure's layout size; PNG scale = PRINT_DPI * inches / px
FIGURE_FORMATS = ("svg", "png", "html")


class ExportError(RuntimeError):
    """An export that cannot be made here (no Chromium for the image formats)."""


def clean(value: object) -> object:
    """A cell as JSON and CSV carry it: numpy scalars as Python numbers, NaN and inf as None."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def table_rows(value: object) -> list[list]:
    """The rows of a gr.Dataframe value (a pandas DataFrame, Gradio's {"data": ...} dict) or a list."""
    if hasattr(value, "values") and hasattr(value, "columns"):
        value = value.values.tolist()
    elif isinstance(value, dict):
        value = value.get("data") or []
    return [[clean(c) for c in row] for row in (value or [])]


def table_csv(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(headers)
    w.writerows([["" if c is None else c for c in map(clean, r)] for r in rows])
    return buf.getvalue()


def table_json(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    """JSON records, one object per row; allow_nan=False makes a stray NaN a bug here, not in a reader."""
    return json.dumps([dict(zip(headers, map(clean, r))) for r in rows], ensure_ascii=False, allow_nan=False,
                      default=str)


def plotly_figure(value: object) -> go.Figure | None:
    """A figure from what a gr.Plot input gives a handler: PlotData (Gradio 6), its dict form, or a figure."""
    if isinstance(value, go.Figure):
        return value
    plot = getattr(value, "plot", None) if not isinstance(value, dict) else value.get("plot")
    if isinstance(plot, str) and plot:
        try:
            return pio.from_json(plot)
        except ValueError:
            return None
    return None


def figure_html(fig: go.Figure) -> str:
    return fig.to_html(include_plotlyjs=True, full_html=True)


def figure_image(fig: go.Figure, fmt: str) -> bytes:
    """SVG or print-size PNG of a figure, drawn by kaleido in the system's Chromium: the process's kept
    browser (figure_browser.py), else a browser of its own."""
    if not have_chromium():
        raise ExportError(f"SVG and PNG need Chromium ({CHROMIUM} is missing): install it (apt-get install "
                          "chromium) or use the HTML")
    os.environ.setdefault("BROWSER_PATH", CHROMIUM)  # kaleido's choreographer finds Chrome through it
    width, height = LAYOUT_PX
    scale = PRINT_DPI * PRINT_INCHES[0] / width if fmt == "png" else 1
    browser = figure_browser.kept_browser()
    if browser is not None:
        try:
            return browser.image(fig.to_dict(), {"format": fmt, "width": width, "height": height, "scale": scale})
        except Exception:  # a kept browser that fails, hangs or died is dropped; this figure gets one of its own
            figure_browser.give_up(browser)
    try:
        try:
            return pio.to_image(fig, format=fmt, width=width, height=height, scale=scale)
        except RuntimeError:  # on a loaded machine kaleido's script can run before its page has loaded: once more
            return pio.to_image(fig, format=fmt, width=width, height=height, scale=scale)
    except (ValueError, RuntimeError, OSError) as e:  # kaleido missing, or Chromium would not start
        raise ExportError(f"{fmt.upper()} export failed: {' '.join(str(e).splitlines())[:200]}") from None


def figure_files(fig: go.Figure) -> tuple[dict[str, bytes | str], str]:
    """{format: contents} of one figure, and a note naming the formats that could not be made."""
    out: dict[str, bytes | str] = {"html": figure_html(fig)}
    note = ""
    for fmt in ("svg", "png"):
        try:
            out[fmt] = figure_image(fig, fmt)
        except ExportError as e:
            note = str(e)
            break
    return out, note


def static_notebook_figures() -> str:
    """Make a notebook's figures carry a static SVG beside the interactive one, so they show where no
    live Jupyter runs them (nbconvert HTML, GitHub). -> the renderer set, or a note when no Chromium."""
    if not have_chromium():
        return f"figures stay interactive only: SVG needs Chromium ({CHROMIUM} is missing)"
    pio.renderers["workbench_svg"] = StaticSvg()
    pio.renderers.default = "plotly_mimetype+workbench_svg"
    return pio.renderers.default


class StaticSvg(pio.base_renderers.MimetypeRenderer):
    """Plotly's svg renderer, drawn through figure_image (its retry and its one-line errors)."""

    def to_mimebundle(self, fig_dict: dict) -> dict:
        return {"image/svg+xml": figure_image(go.Figure(fig_dict), "svg").decode()}
