"""`python -m workbench.screenshots [--out docs/screens]`: the README's screenshots, regenerated.

Starts `app.py` (demo model, CPU) on a free loopback port with a fresh data folder holding one
saved 255-node tree, and photographs each tab in Debian's Chromium with a 12-node (`demo_tuned`),
63-node (`mc_sim_7b_63`) and 255-node tree: Decode after a run, the Tree editor with the tree
loaded, Tune after collecting AR traces, optimising a tree of that size and confirming it, and
Compare (AR vs the tree). Prints the files written, one per line.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from .browser import CHROMIUM, choose, launch, open_page, set_number
from .loadtest import ROOT, start_server

SIZES = {12: "demo_tuned", 63: "mc_sim_7b_63", 255: "saved/big255"}
LONG = 600_000


def _saved_big_tree(data_dir: Path) -> None:
    import trees
    from engine.loading import DEMO_DIR

    from .store import Store

    runs = trees.ar_runs(trees.read_runs(DEMO_DIR / "tune_traces.jsonl"))
    choices = trees.best_tree(runs, 255, max_depth=4, time_limit=10)
    Store(data_dir).save_tree(trees.TreeFile(choices, num_heads=4, name="big255"))


def _wait_text(pg, selector: str, text: str) -> None:
    pg.wait_for_function(f"(document.querySelector({selector!r})?.innerText || '').includes({text!r})", timeout=LONG)


def _shot(pg, path: Path, settle_ms: int) -> Path:
    """A full-page screenshot once the plots have settled (they redraw after the last update)."""
    pg.wait_for_timeout(settle_ms)
    pg.screenshot(path=str(path), full_page=True)
    return path


def decode(pg, n: int, tree: str, out: Path) -> Path:
    pg.get_by_role("tab", name="Decode").click()
    choose(pg, "tree", tree)
    set_number(pg, "max new tokens", 96)
    pg.get_by_role("button", name="Generate").click()
    pg.wait_for_function("!document.querySelector('#stats').innerText.includes('stopped')", timeout=60_000)
    _wait_text(pg, "#stats", "stopped")
    set_number(pg, "step", 3)  # a step early in the run, with its tree, head panel and table
    return _shot(pg, out / f"decode_{n}.png", 2500)


def editor(pg, n: int, tree: str, out: Path) -> Path:
    pg.get_by_role("tab", name="Tree editor").click()
    choose(pg, "load a tree", tree)
    pg.get_by_role("button", name="Load into editor").click()
    pg.wait_for_selector(f"text=valid: {n} nodes", timeout=LONG)
    return _shot(pg, out / f"editor_{n}.png", 1500)


def tune(pg, n: int, out: Path, collect: bool) -> Path:
    pg.get_by_role("tab", name="Tune").click()
    if collect:
        set_number(pg, "prompts", 12)
        set_number(pg, "tokens per prompt", 128)
        pg.get_by_role("button", name="Collect AR traces").click()
        pg.wait_for_selector("text=predictions now use it", timeout=LONG)
    set_number(pg, "tree nodes", n)
    pg.get_by_role("button", name="Optimise → editor").click()
    pg.wait_for_selector(f"text=✓ {n} nodes", timeout=LONG)
    pg.get_by_role("button", name="Confirm the editor's tree (real run on these prompts)").click()
    pg.wait_for_selector(f"text={n} nodes on 12 prompts: measured", timeout=LONG)
    return _shot(pg, out / f"tune_{n}.png", 1000)


def compare(pg, n: int, tree: str, out: Path) -> Path:
    pg.get_by_role("tab", name="Compare").click()
    choose(pg, "B", tree, exact=True)
    before = pg.locator("#cmp-msg").inner_text()
    pg.get_by_role("button", name="Compare", exact=True).click()
    pg.wait_for_function(f"(s => s !== {before!r} && s.includes('B/A speed'))"
                         "(document.querySelector('#cmp-msg').innerText)", timeout=LONG)
    pg.wait_for_function("!document.querySelector('.progress-text, .eta-bar')", timeout=LONG)
    return _shot(pg, out / f"compare_{n}.png", 2000)


def run(out: Path, chromium: str = CHROMIUM) -> list[Path]:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="screens-"))
    _saved_big_tree(data_dir)
    server, url = start_server(data_dir)
    files = []
    try:
        with sync_playwright() as p:
            browser = launch(p, chromium)
            pg = open_page(browser, url)
            for i, (n, tree) in enumerate(SIZES.items()):
                files += [decode(pg, n, tree, out), editor(pg, n, tree, out), tune(pg, n, out, collect=i == 0),
                          compare(pg, n, tree, out)]
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    return files


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "screens")
    p.add_argument("--chromium", default=CHROMIUM)
    a = p.parse_args(argv)
    for f in run(a.out, a.chromium):
        print(f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
