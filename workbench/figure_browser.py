"""One kaleido Chromium kept for every figure image of this process.

kaleido started a browser for each figure: 2.3-2.5 s a figure on a 2-core machine, where a kept one
draws it in 0.16 s after its first (benchmarks/figure_export.py). kaleido's own sync server keeps one too, but it hands results back in the
order they arrive, so two threads exporting at once can swap figures, and it waits without a
timeout, so a browser that fails to start makes every later export hang. Here the browser lives on
an event loop of its own thread; each figure is a future of its own on that loop, and every wait
has a timeout. A browser that will not start, fails a figure or has died is dropped for good: the
caller then draws each figure with a browser of its own, as before. (A dead one must be caught
before it is asked: kaleido never gets its only tab back from a dead browser, and the next figure
would wait the whole timeout.)
"""

from __future__ import annotations

import asyncio
import atexit
import threading

START_S = 60.0  # a loaded machine can take long to start Chromium
FIGURE_S = 120.0
CLOSE_S = 10.0


class BrowserGone(RuntimeError):
    """The kept browser was closed or its Chromium has exited."""


class FigureBrowser:
    def __init__(self):
        import kaleido

        self.closed = False
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="figure-browser", daemon=True).start()
        self.kaleido = kaleido.Kaleido()
        try:
            self._wait(self.kaleido.__aenter__(), START_S)
        except BaseException:
            self.close()  # a half-started Chromium would otherwise live as long as the process
            raise

    def _wait(self, coroutine, timeout: float):
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def alive(self) -> bool:
        process = getattr(self.kaleido, "subprocess", None)  # choreographer's Popen of Chromium
        return not self.closed and self.loop.is_running() and (process is None or process.poll() is None)

    def image(self, fig_dict: dict, opts: dict) -> bytes:
        """The figure as kaleido draws it (`opts`: format, width, height, scale)."""
        if not self.alive():
            raise BrowserGone("the kept figure browser is closed or has exited")
        return self._wait(self.kaleido.calc_fig(fig_dict, opts=opts), FIGURE_S)

    def close(self) -> None:
        """Close Chromium (waiting for figures in flight, at most CLOSE_S), then cancel what is left
        and stop the loop. Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        try:
            self._wait(self.kaleido.__aexit__(None, None, None), CLOSE_S)
        except Exception:  # a browser that hangs on closing is left to the daemon thread's end
            pass

        def stop():
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            self.loop.stop()

        self.loop.call_soon_threadsafe(stop)


def _close_kept() -> None:
    if _browser is not None:
        _browser.close()


_LOCK = threading.Lock()
_browser: FigureBrowser | None = None
_given_up = False


def kept_browser() -> FigureBrowser | None:
    """The process's figure browser, started on first use; None once it could not start or failed."""
    global _browser, _given_up
    with _LOCK:
        if _browser is None and not _given_up:
            try:
                _browser = FigureBrowser()
            except Exception:  # kaleido missing, Chromium not starting or too slow to
                _given_up = True
            else:
                atexit.register(_close_kept)
        return _browser


def give_up(browser: FigureBrowser) -> None:
    """Stop using a browser that failed a figure; it is closed on a thread of its own (it may hang)."""
    global _browser, _given_up
    with _LOCK:
        _given_up = True
        if _browser is not browser:
            return  # another thread dropped it already
        _browser = None
    threading.Thread(target=browser.close, daemon=True).start()
