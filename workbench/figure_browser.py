"""One kaleido Chromium kept for every figure image of this process.

kaleido started a browser for each figure: 3.2-3.8 s a figure on a 2-core machine, where a kept one
draws it in 0.2-0.3 s. kaleido's own sync server keeps one too, but it hands results back in the
order they arrive, so two threads exporting at once can swap figures, and it waits without a
timeout, so a browser that fails to start makes every later export hang. Here the browser lives on
an event loop of its own thread; each figure is a future of its own on that loop, and every wait
has a timeout. A browser that will not start, or stops answering, is dropped for good: the caller
then draws each figure with a browser of its own, as before.
"""

from __future__ import annotations

import asyncio
import atexit
import threading

START_S = 60.0  # a loaded machine can take long to start Chromium
FIGURE_S = 120.0


class FigureBrowser:
    def __init__(self):
        import kaleido

        async def open_browser():
            browser = kaleido.Kaleido()
            await browser.__aenter__()
            return browser

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="figure-browser", daemon=True).start()
        try:
            self.kaleido = self._wait(open_browser(), START_S)
        except BaseException:
            self.loop.call_soon_threadsafe(self.loop.stop)
            raise

    def _wait(self, coroutine, timeout: float):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def image(self, fig_dict: dict, opts: dict) -> bytes:
        """The figure as kaleido draws it (`opts`: format, width, height, scale)."""
        return self._wait(self.kaleido.calc_fig(fig_dict, opts=opts), FIGURE_S)

    def close(self) -> None:
        try:
            self._wait(self.kaleido.__aexit__(None, None, None), 10)
        except Exception:  # a browser that hangs on closing is left to the daemon thread's end
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)


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
        if _browser is browser:
            _browser, _given_up = None, True
    threading.Thread(target=browser.close, daemon=True).start()
