"""`python -m workbench.uibench`: what a researcher's browser sees of a streamed decode, measured.

Starts `app.py` (demo model, CPU) as its own process on a free loopback port and drives Debian's
Chromium with Playwright. For each run length it records, from the Chrome DevTools protocol, every
server-sent message of the decode's stream (bytes, arrival time), and from the page, when the
stats line says the run ended. Reported per length: messages, bytes per message (mean, and first vs
last quarter of the run: flat when nothing is resent), server-done -> page-done delay (the last
message's arrival to the page showing it, both read in the page), and, for the longest run, how long a Stop click takes to
show 'stopped by user'. Prints one JSON object. (Gradio's completion message after a stream repeats
the final values whole; it is counted in bytes_total and the last quarter.)
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from .loadtest import start_server

# In the page: the arrival time (performance.now()) of every chunk of the queue's event stream, and
# of the stats line first saying 'stopped' -- one clock for both ends of the delay.
PAGE_CLOCK = """
window.__chunks = []; window.__done = null;
const realFetch = window.fetch;
window.fetch = async (...args) => {
  const res = await realFetch(...args);
  const url = String(args[0] && args[0].url || args[0]);
  if (!url.includes('queue/data') || !res.body) return res;
  const tee = new TransformStream({transform(chunk, ctl) {
    window.__chunks.push([performance.now(), chunk.byteLength]); ctl.enqueue(chunk); }});
  return new Response(res.body.pipeThrough(tee), {headers: res.headers, status: res.status, statusText: res.statusText});
};
window.__armed = false;  // set once this run's 'decoding' line has replaced the last run's 'stopped'
new MutationObserver(() => {
  const s = document.querySelector('#stats');
  if (!s) return;
  const stopped = s.innerText.includes('stopped');
  if (!stopped) window.__armed = true;
  else if (window.__armed && window.__done === null) window.__done = performance.now();
}).observe(document, {subtree: true, childList: true, characterData: true});
"""
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


class StreamTap:
    """Every chunk of the page's queue/data (server-sent events) responses, with arrival times."""

    def __init__(self, page):
        self.cdp = page.context.new_cdp_session(page)
        self.cdp.send("Network.enable")
        self.ids: set[str] = set()
        self.chunks: list[tuple[float, int, str]] = []  # (time, bytes, text)
        self.cdp.on("Network.responseReceived", self._response)
        self.cdp.on("Network.dataReceived", self._data)

    def _response(self, ev):
        if "queue/data" in ev["response"]["url"]:
            self.ids.add(ev["requestId"])
            try:  # ask for the body as it streams (dataReceived then carries it)
                self.cdp.send("Network.streamResourceContent", {"requestId": ev["requestId"]})
            except Exception:
                pass

    def _data(self, ev):
        if ev["requestId"] in self.ids:
            text = base64.b64decode(ev["data"]).decode("utf-8", "replace") if ev.get("data") else ""
            self.chunks.append((time.perf_counter(), ev["dataLength"], text))

    def reset(self):
        self.chunks.clear()

    def messages(self) -> list[tuple[float, int, dict]]:
        """Server-sent messages of the last run: (arrival, bytes, parsed message)."""
        out = []
        for t, n, text in self.chunks:
            parts = [p for p in text.split("\n\n") if p.startswith("data:")]
            if not parts:
                out.append((t, n, {}))
                continue
            for p in parts:
                try:
                    msg = json.loads(p[5:])
                except ValueError:
                    msg = {}
                out.append((t, len(p.encode()), msg))
        return out


def _set_number(pg, label_part: str, value) -> None:
    labels = pg.eval_on_selector_all("input[type=number]", "els => els.map(e => e.getAttribute('aria-label'))")
    box = pg.locator("input[type=number]").nth(next(i for i, a in enumerate(labels) if a and label_part in a))
    box.fill(str(value))
    box.press("Enter")
    box.blur()
    pg.wait_for_timeout(400)


def _wait_run(pg, what: str, timeout: int = 600_000) -> None:
    """Wait for this run's end: first the 'decoding' line Generate writes, then `what`."""
    pg.wait_for_function("!document.querySelector('#stats').innerText.includes('stopped')", timeout=60_000,
                         polling="raf")
    pg.wait_for_function(f"document.querySelector('#stats').innerText.includes({what!r})", timeout=timeout, polling="raf")


def _choose_tree(pg, tree: str) -> None:
    dd = pg.get_by_label("tree").first
    dd.click()
    dd.fill(tree)
    pg.wait_for_timeout(300)
    pg.keyboard.press("Enter")
    pg.wait_for_timeout(300)


def measure_run(pg, tap: StreamTap, tokens: int) -> dict:
    _set_number(pg, "max new tokens", tokens)
    tap.reset()
    t0 = time.perf_counter()
    pg.evaluate("() => { window.__chunks = []; window.__done = null; window.__armed = false; }")
    pg.get_by_role("button", name="Generate").click()
    _wait_run(pg, "stopped")
    page_done = time.perf_counter()
    pg.wait_for_timeout(500)  # let the stream's last events reach us
    every = tap.messages()
    streaming = {m.get("event_id") for _, _, m in every if m.get("msg") == "process_generating"}
    msgs = [x for x in every if x[2].get("event_id") in streaming and x[2].get("msg") in ("process_generating",
                                                                                           "process_completed")]
    sizes = [n for _, n, _ in msgs]
    # the updates streamed while the run goes on: every process_generating message but the last (the
    # final one also carries the whole-run figures, and the completion message repeats everything)
    live = [n for _, n, m in msgs if m.get("msg") == "process_generating"][:-1]
    lq = max(1, len(live) // 4)
    q = max(1, len(sizes) // 4)
    chunks, done = pg.evaluate("() => [window.__chunks, window.__done]")
    # the last chunk before the page said 'stopped' carried the server's final update (the completion
    # message after it repeats the final values, as Gradio does)
    before = [t for t, _ in chunks if t <= done] if done is not None else []
    return {"tokens": tokens, "stats": pg.locator("#stats").inner_text(), "messages": len(msgs),
            "bytes_total": sum(sizes), "bytes_per_message_mean": round(statistics.fmean(sizes), 1) if sizes else None,
            "bytes_per_message_first_quarter": round(statistics.fmean(sizes[:q]), 1) if sizes else None,
            "bytes_per_message_last_quarter": round(statistics.fmean(sizes[-q:]), 1) if sizes else None,
            "live_updates": len(live),
            "bytes_per_live_update_first_quarter": round(statistics.fmean(live[:lq]), 1) if live else None,
            "bytes_per_live_update_last_quarter": round(statistics.fmean(live[-lq:]), 1) if live else None,
            "click_to_page_done_s": round(page_done - t0, 3),
            "last_update_arrived_to_page_done_s": round((done - before[-1]) / 1000, 3) if before else None}


def measure_stop(pg, tokens: int, after_s: float) -> dict:
    _set_number(pg, "max new tokens", tokens)
    pg.get_by_role("button", name="Generate").click()
    pg.wait_for_function("!document.querySelector('#stats').innerText.includes('stopped')", timeout=60_000)
    pg.wait_for_function("document.querySelector('#stats').innerText.includes('tokens,')", timeout=120_000)
    pg.wait_for_timeout(int(after_s * 1000))
    t0 = time.perf_counter()
    pg.get_by_role("button", name="Stop").click()
    pg.wait_for_function("document.querySelector('#stats').innerText.includes('stopped by user')", timeout=120_000,
                         polling="raf")
    return {"asked_tokens": tokens, "click_after_s": after_s, "stop_click_to_page_s": round(time.perf_counter() - t0, 3),
            "stats": pg.locator("#stats").inner_text()}


def run(lengths: list[int], tree: str, chromium: str) -> dict:
    from playwright.sync_api import sync_playwright

    data_dir = Path(tempfile.mkdtemp(prefix="uibench-"))
    server, url = start_server(data_dir)
    out: dict = {"tree": tree, "runs": []}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=FLAGS)
            pg = browser.new_page(viewport={"width": 1400, "height": 1000})
            pg.add_init_script(PAGE_CLOCK)
            tap = StreamTap(pg)
            pg.goto(url)
            pg.wait_for_selector("text=Generate", timeout=120_000)
            _choose_tree(pg, tree)
            measure_run(pg, tap, 16)  # warm-up
            for n in lengths:
                out["runs"].append(measure_run(pg, tap, n))
            out["stop"] = measure_stop(pg, max(lengths), 1.0)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--lengths", default="96,384,1024")
    p.add_argument("--tree", default="mc_sim_7b_63")
    p.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    a = p.parse_args(argv)
    res = run([int(x) for x in a.lengths.split(",")], a.tree, a.chromium)
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), **res}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
