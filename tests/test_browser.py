"""The app in Debian's Chromium driven by Playwright, as a researcher uses it: long runs stopped
mid-way, two sessions at once, 63- and 255-node trees, saved work after a reload.

Screenshots go to artifacts/ (look at them). Skipped when chromium or playwright is missing.
"""

import json
import socket
from pathlib import Path

import pytest

from workbench.browser import choose as browser_choose
from workbench.browser import have_chromium, launch, open_page, set_number

pw = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.skipif(not have_chromium(), reason="Debian chromium is not installed")
ART = Path(__file__).resolve().parent.parent / "artifacts"
LABELS_JS = """(sel) => {
  const els = [...document.querySelectorAll(sel + ' g.textpoint text')].filter(t => t.textContent.trim());
  const r = els.map(e => e.getBoundingClientRect());
  const bad = [];
  for (let i = 0; i < r.length; i++) for (let j = i + 1; j < r.length; j++) {
    const ox = Math.min(r[i].right, r[j].right) - Math.max(r[i].left, r[j].left);
    const oy = Math.min(r[i].bottom, r[j].bottom) - Math.max(r[i].top, r[j].top);
    if (ox > 0.5 && oy > 0.5) bad.push([els[i].textContent, els[j].textContent]);
  }
  return {labels: els.length, overlapping: bad};
}"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def big_tree():
    import trees
    from engine.loading import DEMO_DIR

    runs = trees.ar_runs(trees.read_runs(DEMO_DIR / "tune_traces.jsonl"))
    return trees.best_tree(runs, 255, max_depth=4, time_limit=10)


@pytest.fixture(scope="module")
def app_url(demo_engine, tmp_path_factory, big_tree):
    import trees
    from engine.loading import DEMO_DIR
    from workbench.app import serve
    from workbench.core import Workbench

    wb = Workbench(demo_engine, tmp_path_factory.mktemp("browser"), DEMO_DIR / "tune_traces.jsonl")
    wb.store.save_tree(trees.TreeFile(big_tree, num_heads=4, name="big255"))
    app, url = serve(wb, port=_free_port(), block=False)
    yield url
    app.close()


@pytest.fixture(scope="module")
def browser():
    ART.mkdir(exist_ok=True)
    with pw.sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


def choose(pg, label: str, value: str, nth: int = 0) -> None:
    assert browser_choose(pg, label, value, nth) == value


def stats(pg) -> str:
    return pg.locator("#stats").inner_text()


def wait_done(pg, timeout=240_000):
    pg.wait_for_function("document.querySelector('#stats').innerText.includes('stopped')", timeout=timeout)


def test_loads_without_console_errors(browser, app_url):
    pg = browser.new_context().new_page()
    errors = []
    pg.on("console", lambda m: m.type == "error" and errors.append(m.text))
    pg.goto(app_url)
    pg.wait_for_selector("text=Generate", timeout=60_000)
    assert pg.title() == "medusa-workbench"
    assert [e for e in errors if "favicon" not in e] == []
    pg.context.close()


def test_decode_streams_and_a_click_on_the_text_selects_its_step(browser, app_url):
    pg = open_page(browser, app_url)
    pg.get_by_role("button", name="Generate").click()
    wait_done(pg)
    assert "stopped: length" in stats(pg)
    spans = pg.locator("#out-text span[data-step]")
    assert spans.count() > 10
    target = spans.nth(5)
    step = int(target.get_attribute("data-step"))
    target.click()
    pg.wait_for_function("(s) => document.querySelector('#tree-plot .gtitle')?.textContent.startsWith('step ' + s + ':')",
                         arg=step, timeout=30_000)
    assert pg.locator("#out-text span.sel").get_attribute("data-step") == str(step)  # highlighted in the text
    pg.screenshot(path=str(ART / "decode.png"), full_page=True)
    pg.context.close()


def test_stop_ends_only_its_own_sessions_run(browser, app_url, demo_engine, big_tree):
    """Session A decodes 384 tokens with a 255-node tree and presses Stop 2 s in; session B, started at
    the same time, runs to the end and gets exactly what a solo run gives."""
    a, b = open_page(browser, app_url), open_page(browser, app_url)
    for pg in (a, b):
        set_number(pg, "max new tokens", 384)
    choose(a, "tree", "saved/big255")
    a.get_by_role("button", name="Generate").click()
    b.get_by_role("button", name="Generate").click()
    a.wait_for_function("document.querySelector('#stats').innerText.includes('tokens')", timeout=60_000)
    a.wait_for_timeout(2000)
    a.get_by_role("button", name="Stop").click()  # how fast it shows is measured by the loadtest, not asserted here
    a.wait_for_function("document.querySelector('#stats').innerText.includes('stopped by user')", timeout=60_000)
    n_a = int(stats(a).split()[0])
    assert n_a < 384, stats(a)
    wait_done(b)
    assert "stopped: length" in stats(b) and stats(b).startswith("384 tokens")
    solo = demo_engine.generate("def read_config(path):", 384, mode="medusa", tree="demo_tuned", seed=0)
    assert b.locator("#out-text pre, #out-text").first.inner_text().strip() == solo.text.strip()
    for pg in (a, b):
        pg.context.close()


@pytest.mark.parametrize("tree", ["mc_sim_7b_63", "saved/big255"])
def test_big_trees_draw_without_overlapping_labels(browser, app_url, tree):
    pg = open_page(browser, app_url)
    choose(pg, "tree", tree)
    set_number(pg, "max new tokens", 48)
    pg.get_by_role("button", name="Generate").click()
    wait_done(pg)
    pg.get_by_label("show every node").check()
    n = 63 if tree == "mc_sim_7b_63" else 255
    pg.wait_for_function(f"document.querySelector('#tree-plot .gtitle')?.textContent.includes('{n} drawn')",
                         timeout=30_000)
    pg.wait_for_timeout(500)
    got = pg.evaluate(LABELS_JS, "#tree-plot")
    assert got["labels"] > 25 and got["overlapping"] == [], got
    name = "tree63" if n == 63 else "tree255"
    pg.locator("#tree-plot").screenshot(path=str(ART / f"decode_{name}.png"))
    pg.get_by_role("tab", name="Tree editor").click()
    choose(pg, "load a tree", tree)
    pg.get_by_role("button", name="Load into editor").click()
    pg.wait_for_selector(f"text=valid: {n} nodes", timeout=30_000)
    pg.wait_for_timeout(800)
    got = pg.evaluate(LABELS_JS, "#editor-plot")
    assert got["labels"] > 20 and got["overlapping"] == [], got
    pg.screenshot(path=str(ART / f"editor_{name}.png"), full_page=True)
    pg.context.close()


def test_invalid_edit_names_the_rule_and_a_saved_tree_is_in_every_dropdown_after_reload(browser, app_url, tmp_path):
    pg = open_page(browser, app_url)
    pg.get_by_role("tab", name="Tree editor").click()
    editor = pg.locator(".cm-content").first
    editor.click()
    pg.keyboard.press("Control+A")
    pg.keyboard.type("[[0], [1, 2]]")
    pg.wait_for_selector("text=prefix [1] is missing", timeout=30_000)
    editor.click()
    pg.keyboard.press("Control+A")
    pg.keyboard.type("[[0], [1], [0, 0], [0, 1]]")
    pg.wait_for_selector("text=valid: 4 nodes", timeout=30_000)
    pg.get_by_label("save as").fill("browser_tree")
    pg.get_by_role("button", name="Save").click()
    pg.wait_for_selector("text=saved as saved/browser_tree", timeout=30_000)
    with pg.expect_download() as dl:
        pg.locator('a[download="browser_tree.json"]').first.click()
    f = tmp_path / "t.json"
    dl.value.save_as(f)
    data = json.loads(f.read_text())
    assert data["medusa_choices"] == [[0], [1], [0, 0], [0, 1]] and data["schema_version"] == 1
    pg.reload()
    pg.wait_for_selector("text=Generate", timeout=60_000)
    seen = {}
    for tab, labels in (("Decode", [("tree", 0)]), ("Tree editor", [("load a tree", 0), ("diff: from", 0), ("to", 0)]),
                        ("Compare", [("A", 0), ("B", 0), ("tree", 1)])):
        pg.get_by_role("tab", name=tab).click()
        for label, nth in labels:
            dd = pg.get_by_label(label, exact=True).nth(nth)
            dd.click()
            pg.wait_for_timeout(300)
            seen[(tab, label, nth)] = pg.locator("[role=option]").all_inner_texts()
            pg.keyboard.press("Escape")
    assert all("saved/browser_tree" in opts for opts in seen.values()), seen
    pg.context.close()
