"""A/B of the Decode page's cost: `python benchmarks/page_ab.py BEFORE AFTER ROUNDS [TREE]` starts the app of
two checkouts (e.g. `git worktree add /tmp/before HEAD~1` and `.`), opens one Chromium page on each and runs
ROUNDS interleaved rounds per app (the order swaps every round, so both see the same load): a 1,000-token
run from the page, then the same run through the API (`workbench.uibench.heavy_round`). TREE is a preset
(default `mc_sim_7b_63`) or `saved/uibench255`, uibench's 255-node tree. Prints each round and a summary as
JSON: the page's main-thread busy seconds, its longest task, and page vs API tokens/s."""

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from gradio_client import Client
from playwright.sync_api import sync_playwright

import workbench.loadtest as lt
from workbench import uibench
from workbench.browser import choose, launch, open_page

TREE, TOKENS = "mc_sim_7b_63", 1000


def main(before: Path, after: Path, rounds: int, tree: str = TREE) -> dict:
    apps = {}
    for name, root in (("before", before), ("after", after)):
        lt.ROOT = root  # start_server runs ROOT/app.py, which imports its own checkout's workbench
        data = Path(tempfile.mkdtemp(prefix=f"page-ab-{name}-"))
        if tree == f"saved/{uibench.BIG_TREE}":
            uibench.save_big_tree(data)
        apps[name] = lt.start_server(data)
    out: dict = {"before": str(before), "after": str(after), "tree": tree, "loadavg_at_start": os.getloadavg(),
                 "rounds": []}
    try:
        with sync_playwright() as p:
            browser = launch(p)
            pages = {}
            for name, (_, url) in apps.items():
                pg = open_page(browser, url, uibench.PAGE_CLOCK)
                cdp = pg.context.new_cdp_session(pg)
                cdp.send("Performance.enable")
                choose(pg, "tree", tree)
                pages[name] = (pg, cdp, Client(url, verbose=False))
                uibench.heavy_round(*pages[name], tree, 200)  # warm-up: Plotly's first draws, the engine's caches
            for i in range(rounds):
                for name in ("before", "after") if i % 2 == 0 else ("after", "before"):
                    r = uibench.heavy_round(*pages[name], tree, TOKENS)
                    row = {"app": name, "main_thread_s": r["main_thread_s"]["tasks"],
                           "longtask_max_ms": r["longtasks"]["max_ms"], "page_tokens_per_s": r["page_tokens_per_s"],
                           "api_tokens_per_s": r["api_tokens_per_s"], "api_over_page": r["api_over_page"],
                           "api_stats": r["api_stats"]}
                    out["rounds"].append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        for proc, _ in apps.values():
            proc.terminate()
            proc.wait(timeout=30)
    out["loadavg_at_end"] = os.getloadavg()
    out["mean"] = {name: {k: round(statistics.fmean(r[k] for r in out["rounds"] if r["app"] == name), 3)
                          for k in ("main_thread_s", "longtask_max_ms", "page_tokens_per_s", "api_over_page")
                          if all(r[k] is not None for r in out["rounds"])}
                   for name in ("before", "after")}
    return out


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve(), int(sys.argv[3]), *sys.argv[4:5])))
