"""`python -m workbench.uibench`: what a researcher's browser sees of a streamed decode, measured.

Starts `app.py` (demo model, CPU) as its own process on a free loopback port and drives Debian's
Chromium with Playwright. For each run length it records, from the Chrome DevTools protocol, every
server-sent message of the decode's stream (bytes, arrival time), and from the page, when the
stats line says the run ended. Reported per length: messages and bytes; for the two kinds of live
update (text only, and text with the newest step's figures, at most once a second) their count and
mean bytes in the first and second half of the run (equal when nothing is resent); the delay from
the last message's arrival to the page showing the end (both read in the page); and, for the
longest run, how long a Stop click takes to show 'stopped by user'. Prints one JSON object.
(Gradio's completion message after a stream repeats the final values whole; it is counted in
bytes_total only.)

Then the page's weight over long runs (issue 31), per tree (63 and 255 nodes): three rounds of a
1,000-token run driven from the page, each followed by the same run through the API; per round the
main thread's long tasks (PerformanceObserver 'longtask': count, sum, max) and busy seconds from the click to
1.5 s after the end (Performance.getMetrics: tasks, script, style, layout), the DOM after a garbage
collection (Memory.getDOMCounters: nodes and listeners, and how many nodes are detached from the
document), and tokens/s from the page and from the API. Last, Stop from two pages at once (the
second page's run waits in the queue behind the first's) under `--load` busy processes: seconds from
each click to its page saying 'stopped by user'.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .browser import CHROMIUM, choose, launch, open_page, set_number
from .loadtest import start_server

BIG_TREE = "uibench255"  # saved into the server's data folder before it starts
PROMPT = "def read_config(path):"
TARGETS = {"longtask_max_ms": 200, "dom_growth_run1_to_run3": 0, "api_over_page_tokens_per_s": 1.2, "stop_s": 1.0}

# In the page: the arrival time (performance.now()) of every chunk of the queue's event stream, and
# of the stats line first saying 'stopped' -- one clock for both ends of the delay.
PAGE_CLOCK = """
window.__chunks = []; window.__done = null; window.__long = [];
new PerformanceObserver((list) => { for (const e of list.getEntries()) window.__long.push(e.duration); })
  .observe({type: 'longtask', buffered: true});
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
// The stats line is read as textContent, here and in every wait: this observer runs on each change to
// the page, and innerText would force a style and layout pass each time, a cost of the measurement
// that the page's long tasks would carry (the text, and so the word looked for, is the same).
new MutationObserver(() => {
  const s = document.querySelector('#stats');
  if (!s) return;
  const stopped = s.textContent.includes('stopped');
  if (!stopped) window.__armed = true;
  else if (window.__armed && window.__done === null) window.__done = performance.now();
}).observe(document, {subtree: true, childList: true, characterData: true});
"""


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


def _wait_run(pg, what: str, timeout: int = 600_000, polling: str | int = "raf") -> None:
    """Wait for this run's end: first the 'decoding' line Generate writes, then `what`. Polling "raf"
    checks every frame (the end is seen within one); a number of milliseconds is lighter on the page."""
    pg.wait_for_function("!document.querySelector('#stats').textContent.includes('stopped')", timeout=60_000,
                         polling=polling)
    pg.wait_for_function(f"document.querySelector('#stats').textContent.includes({what!r})", timeout=timeout,
                         polling=polling)


def _has_figures(msg: dict) -> bool:
    """Whether a streamed update carries figures (more than 2 KB of values other than the text) or
    only text. The decode stream sends none: the last step's figures come in an event after it."""
    data = (msg.get("output") or {}).get("data") or []
    return len(json.dumps(data[:1] + data[2:])) > 2000


def _halves(sizes: list[int]) -> dict:
    """Count and mean bytes in the first and second half of the run: equal when nothing is resent."""
    h = len(sizes) // 2
    mean = (lambda xs: round(statistics.fmean(xs), 1) if xs else None)
    return {"n": len(sizes), "bytes_mean_first_half": mean(sizes[:h] or sizes), "bytes_mean_second_half": mean(sizes[h:]),
            "bytes_max": max(sizes) if sizes else None}


def measure_run(pg, tap: StreamTap, tokens: int) -> dict:
    set_number(pg, "max new tokens", tokens)
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
    # final one also carries the saved-runs list, and the completion message repeats everything).
    # Two kinds: text updates (new text pieces as Gradio's string diff, stats, step slider) and figure
    # updates (none since the figures are drawn for the selected step only)
    live = [(n, m) for _, n, m in msgs if m.get("msg") == "process_generating"][:-1]
    kinds = {"text_updates": [n for n, m in live if not _has_figures(m)],
             "figure_updates": [n for n, m in live if _has_figures(m)]}
    chunks, done = pg.evaluate("() => [window.__chunks, window.__done]")
    # the last chunk before the page said 'stopped' carried the server's final update (the completion
    # message after it repeats the final values, as Gradio does)
    before = [t for t, _ in chunks if t <= done] if done is not None else []
    return {"tokens": tokens, "stats": pg.locator("#stats").inner_text(), "messages": len(msgs),
            "bytes_total": sum(sizes), "bytes_per_message_mean": round(statistics.fmean(sizes), 1) if sizes else None,
            **{kind: _halves(v) for kind, v in kinds.items()},
            "click_to_page_done_s": round(page_done - t0, 3),
            "last_update_arrived_to_page_done_s": round((done - before[-1]) / 1000, 3) if before else None}


def measure_stop(pg, tokens: int, after_s: float) -> dict:
    set_number(pg, "max new tokens", tokens)
    pg.get_by_role("button", name="Generate").click()
    pg.wait_for_function("!document.querySelector('#stats').textContent.includes('stopped')", timeout=60_000)
    pg.wait_for_function("document.querySelector('#stats').textContent.includes('tokens,')", timeout=120_000)
    pg.wait_for_timeout(int(after_s * 1000))
    t0 = time.perf_counter()
    pg.get_by_role("button", name="Stop").click()
    pg.wait_for_function("document.querySelector('#stats').textContent.includes('stopped by user')", timeout=120_000,
                         polling="raf")
    return {"asked_tokens": tokens, "click_after_s": after_s, "stop_click_to_page_s": round(time.perf_counter() - t0, 3),
            "stats": pg.locator("#stats").inner_text()}


def tokens_per_s(stats: str) -> float | None:
    m = re.search(r"([\d.]+) tokens/s\b", stats)  # not 'tokens/step'
    return float(m.group(1)) if m else None


def dom_counts(pg, cdp) -> dict:
    """After a full garbage collection: DOM nodes and listeners alive (Memory.getDOMCounters counts
    detached nodes still referenced too) and the nodes in the document; the difference is detached."""
    cdp.send("HeapProfiler.collectGarbage")
    c = cdp.send("Memory.getDOMCounters")
    live = pg.evaluate("""() => { const w = document.createTreeWalker(document, NodeFilter.SHOW_ALL);
                                   let n = 1; while (w.nextNode()) n++; return n; }""")
    return {"nodes": c["nodes"], "listeners": c["jsEventListeners"], "in_document": live,
            "detached": max(0, c["nodes"] - live)}


def main_thread_s(cdp) -> dict:
    """Seconds the page's main thread has spent so far (Performance.getMetrics): in all tasks, in script,
    in style and in layout. Long tasks show the worst moments; this shows what the page took from the
    CPU that the decode shares."""
    m = {x["name"]: x["value"] for x in cdp.send("Performance.getMetrics")["metrics"]}
    return {"tasks": m["TaskDuration"], "script": m["ScriptDuration"], "style": m["RecalcStyleDuration"],
            "layout": m["LayoutDuration"]}


def heavy_round(pg, cdp, client, tree: str, tokens: int) -> dict:
    """One 1,000-token run from the page (long tasks, main-thread time and DOM after it), then the same run
    through the API."""
    set_number(pg, "max new tokens", tokens)
    pg.evaluate("() => { window.__long = []; }")
    busy0 = main_thread_s(cdp)
    t0 = time.perf_counter()
    pg.get_by_role("button", name="Generate").click()
    # polled every 100 ms, not every frame: a per-frame check keeps the page rendering 60 frames a
    # second through the whole run, CPU that the page's own decode would not compete with (its
    # tokens/s is the server's own count; page_click_to_done_s is then up to 0.1 s late)
    _wait_run(pg, "stopped", polling=100)
    page_wall = time.perf_counter() - t0
    pg.wait_for_timeout(1500)  # the closing update and the figures of the last step are drawn
    longs = pg.evaluate("() => window.__long")
    busy = {k: round(v - busy0[k], 2) for k, v in main_thread_s(cdp).items()}  # the run and its end
    page_stats = pg.locator("#stats").inner_text()
    dom = dom_counts(pg, cdp)
    t0 = time.perf_counter()
    api = client.predict(PROMPT, tree, "medusa", "greedy", 0.7, 1.0, 0, tokens, api_name="/generate")
    api_wall = time.perf_counter() - t0
    page_tps, api_tps = tokens_per_s(page_stats), tokens_per_s(api.get("stats", ""))
    return {"page_stats": page_stats, "api_stats": api.get("stats"), "longtasks": {"n": len(longs), "sum_ms": round(sum(longs)),
                                                   "max_ms": round(max(longs, default=0))},
            "main_thread_s": busy, "dom": dom, "page_tokens_per_s": page_tps, "api_tokens_per_s": api_tps,
            "api_over_page": round(api_tps / page_tps, 3) if page_tps and api_tps else None,
            "page_click_to_done_s": round(page_wall, 2), "api_call_s": round(api_wall, 2)}


def heavy_runs(browser, url: str, trees_: list[str], tokens: int, rounds: int = 3) -> dict:
    from gradio_client import Client

    client = Client(url, verbose=False)
    out = {}
    for tree in trees_:
        pg = open_page(browser, url, PAGE_CLOCK)
        cdp = pg.context.new_cdp_session(pg)
        cdp.send("Performance.enable")
        choose(pg, "tree", tree)
        before = dom_counts(pg, cdp)
        rs = [heavy_round(pg, cdp, client, tree, tokens) for _ in range(rounds)]
        out[tree] = {"dom_before": before, "rounds": rs,
                     "dom_nodes_after_runs": [r["dom"]["nodes"] for r in rs],
                     "dom_growth_run1_to_run3": rs[-1]["dom"]["nodes"] - rs[0]["dom"]["nodes"],
                     "longtask_max_ms": max(r["longtasks"]["max_ms"] for r in rs),
                     "longtask_sum_ms": [r["longtasks"]["sum_ms"] for r in rs],
                     "main_thread_s": [r["main_thread_s"]["tasks"] for r in rs],
                     "api_over_page": [r["api_over_page"] for r in rs]}
        pg.context.close()
    return out


def busy(n: int) -> list[subprocess.Popen]:
    """n processes that spin a CPU each: the load under which Stop is measured."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def two_page_stop(browser, url: str, tree: str, tokens: int, load: int, after_s: float = 1.5) -> dict:
    """Pages A and B press Generate (B's run waits in the queue behind A's); after_s into A's stream,
    Stop in B, then Stop in A: seconds from each click to its page saying 'stopped by user'."""
    a, b = open_page(browser, url), open_page(browser, url)
    for pg in (a, b):
        choose(pg, "tree", tree)
        set_number(pg, "max new tokens", tokens)
    spinners = busy(load)
    try:
        a.get_by_role("button", name="Generate").click()
        a.wait_for_function("document.querySelector('#stats').textContent.includes('tokens,')", timeout=120_000)
        b.get_by_role("button", name="Generate").click()
        a.wait_for_timeout(int(after_s * 1000))
        out = {"load_processes": load, "loadavg_1min": round(os.getloadavg()[0], 2)}
        for name, pg in (("queued_page_B", b), ("running_page_A", a)):
            t0 = time.perf_counter()
            pg.get_by_role("button", name="Stop").click()
            pg.wait_for_function("document.querySelector('#stats').textContent.includes('stopped by user')",
                                 timeout=120_000, polling="raf")
            out[name] = {"stop_click_to_page_s": round(time.perf_counter() - t0, 3),
                         "stats": pg.locator("#stats").inner_text()}
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    for pg in (a, b):
        pg.context.close()
    return out


def save_big_tree(data_dir: Path) -> None:
    """A 255-node tree fitted to the demo model's traces, saved where the server will list it."""
    import trees
    from engine.loading import DEMO_DIR

    from .store import Store

    runs = trees.ar_runs(trees.read_runs(DEMO_DIR / "tune_traces.jsonl"))
    paths = trees.best_tree(runs, 255, max_depth=4, time_limit=10)
    Store(data_dir).save_tree(trees.TreeFile(paths, num_heads=4, name=BIG_TREE))


def run(lengths: list[int], tree: str, chromium: str, heavy_tokens: int = 1000, load: int = 2) -> dict:
    from playwright.sync_api import sync_playwright

    data_dir = Path(tempfile.mkdtemp(prefix="uibench-"))
    save_big_tree(data_dir)
    server, url = start_server(data_dir)
    out: dict = {"tree": tree, "cpus": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
                 "targets": TARGETS, "runs": []}
    try:
        with sync_playwright() as p:
            browser = launch(p, chromium)
            pg = open_page(browser, url, PAGE_CLOCK)
            tap = StreamTap(pg)  # the app's event streams open on Generate, after the page has loaded
            choose(pg, "tree", tree)
            measure_run(pg, tap, 16)  # warm-up
            for n in lengths:
                out["runs"].append(measure_run(pg, tap, n))
            out["stop"] = measure_stop(pg, max(lengths), 1.0)
            pg.context.close()
            out["heavy"] = heavy_runs(browser, url, ["mc_sim_7b_63", f"saved/{BIG_TREE}"], heavy_tokens)
            out["two_page_stop"] = two_page_stop(browser, url, f"saved/{BIG_TREE}", heavy_tokens, load)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--lengths", default="96,384,1024")
    p.add_argument("--tree", default="mc_sim_7b_63")
    p.add_argument("--chromium", default=CHROMIUM)
    p.add_argument("--heavy-tokens", type=int, default=1000, help="tokens per run of the page-weight rounds")
    p.add_argument("--load", type=int, default=2, help="busy processes while Stop is measured from two pages")
    a = p.parse_args(argv)
    res = run([int(x) for x in a.lengths.split(",")], a.tree, a.chromium, a.heavy_tokens, a.load)
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), **res}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
