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

        starts = []
        start = figure_browser.FigureBrowser.__init__
        figure_browser.FigureBrowser.__init__ = lambda self: (starts.append(1), start(self))[1]
        for _ in range(2):
            t0 = time.perf_counter()
            try:
                exports.figure_image(go.Figure(), "svg")
                print("drawn")
            except exports.ExportError as e:
                print("error", round(time.perf_counter() - t0) < 30, "SVG export failed" in str(e))
        print(figure_browser.kept_browser() is None, len(starts))
    """, env={"BROWSER_PATH": "/bin/false"})
    assert out.split() == ["error", "True", "True", "error", "True", "True", "True", "1"]  # tried once only


def test_a_browser_that_stops_answering_is_dropped_and_the_figure_still_drawn():
    out = run("""
        import plotly.graph_objects as go
        from workbench import exports, figure_browser

        import time

        exports.figure_image(go.Figure(), "svg")  # started and answering
        kept = figure_browser.kept_browser()
        figure_browser.FIGURE_S = 1e-4  # the next figure times out
        svg = exports.figure_image(go.Figure(layout={"title": "afterwards"}), "svg").decode()
        chromium = kept.kaleido.subprocess
        deadline = time.time() + 30
        while chromium.poll() is None and time.time() < deadline:  # the dropped browser is closed
            time.sleep(0.1)
        print("afterwards" in svg, figure_browser.kept_browser() is None, chromium.poll() is not None)
    """)
    assert out.split() == ["True", "True", "True"]


def test_a_browser_that_died_is_dropped_before_it_is_asked():
    out = run("""
        import time
        import plotly.graph_objects as go
        from workbench import exports, figure_browser

        exports.figure_image(go.Figure(), "svg")
        chromium = figure_browser.kept_browser().kaleido.subprocess
        chromium.kill()  # as the OOM killer would
        chromium.wait(30)
        t0 = time.perf_counter()  # kaleido would wait FIGURE_S for a tab a dead browser never gives back
        svg = exports.figure_image(go.Figure(layout={"title": "after"}), "svg").decode()
        print("after" in svg, time.perf_counter() - t0 < 60, figure_browser.kept_browser() is None)
    """)
    assert out.split() == ["True", "True", "True"]


def test_a_closed_browser_refuses_at_once():
    """A thread that took the browser before another dropped and closed it must not wait on its
    stopped loop for the figure timeout."""
    out = run("""
        import time
        import plotly.graph_objects as go
        from workbench import exports, figure_browser

        exports.figure_image(go.Figure(), "svg")
        kept = figure_browser.kept_browser()
        kept.close()
        figure_browser.FIGURE_S = 20
        t0 = time.perf_counter()
        try:
            kept.image(go.Figure().to_dict(), {"format": "svg", "width": 100, "height": 100, "scale": 1})
            print("drawn")
        except figure_browser.BrowserGone:
            print("refused", time.perf_counter() - t0 < 1)
    """)
    assert out.split() == ["refused", "True"]
