"""The kept figure browser (workbench/figure_browser.py): concurrent exports each get their own
figure, a browser that will not start costs one quick ExportError instead of a hang, and one that
stops answering is dropped while the figure is still drawn. Each case runs in a fresh interpreter:
the kept browser is per process."""

import subprocess
import sys
import textwrap

import pytest

from workbench.browser import have_chromium

pytestmark = pytest.mark.skipif(not have_chromium(), reason="Debian chromium is not installed")


def run(code: str, env: dict | None = None) -> str:
    import os

    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=240,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_concurrent_exports_each_get_their_own_figure():
    out = run("""
        import threading
        import plotly.graph_objects as go
        from workbench import exports, figure_browser

        wrong = []
        def worker(i):
            for j in range(4):
                name = f"fig{i}x{j}end"
                svg = exports.figure_image(go.Figure(layout={"title": name}), "svg").decode()
                wrong.extend([name] if name not in svg else [])
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print(len(wrong), figure_browser.kept_browser() is not None)
    """)
    assert out.split() == ["0", "True"]


def test_a_browser_that_will_not_start_is_one_quick_error():
    out = run("""
        import time
        import plotly.graph_objects as go
        from workbench import exports, figure_browser

        for _ in range(2):
            t0 = time.perf_counter()
            try:
                exports.figure_image(go.Figure(), "svg")
                print("drawn")
            except exports.ExportError as e:
                print("error", round(time.perf_counter() - t0) < 30, "SVG export failed" in str(e))
        print(figure_browser.kept_browser() is None)
    """, env={"BROWSER_PATH": "/bin/false"})
    assert out.split() == ["error", "True", "True", "error", "True", "True", "True"]


def test_a_browser_that_stops_answering_is_dropped_and_the_figure_still_drawn():
    out = run("""
        import plotly.graph_objects as go
        from workbench import exports, figure_browser

        exports.figure_image(go.Figure(), "svg")  # started and answering
        figure_browser.FIGURE_S = 1e-4  # the next figure times out
        svg = exports.figure_image(go.Figure(layout={"title": "afterwards"}), "svg").decode()
        print("afterwards" in svg, figure_browser.kept_browser() is None)
    """)
    assert out.split() == ["True", "True"]
