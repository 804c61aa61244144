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
from workbench.core import MODEL_TREE

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
    # Plotly was loaded and its first draws made as the page opened, and the warm-up drawing let go of
    pg.wait_for_selector("#plotly-warmup [data-warmed=purged]", state="attached", timeout=60_000)
    assert pg.evaluate("document.querySelectorAll('#plotly-warmup .main-svg, #plotly-warmup .modebar').length") == 0
    assert [e for e in errors if "favicon" not in e] == []
    pg.context.close()


def test_structured_clone_returns_primitives_as_they_are_and_still_clones_the_rest(browser, app_url):
    """The page's `structuredClone` skips the native call for primitives (workbench/page.py CLONE_JS: Gradio's
    loading-status updates sent 250,000 of them a long run through it) and keeps its meaning for the rest."""
    pg = open_page(browser, app_url)
    got = pg.evaluate("""() => {
      const o = {a: [1, {b: 'x'}], d: new Date(0)}, c = structuredClone(o);
      let threw = null, none = null;
      try { structuredClone(() => 1); } catch (e) { threw = e.name; }
      try { structuredClone(); } catch (e) { none = e.name; }
      const buffer = new ArrayBuffer(8);
      structuredClone(1, {transfer: [buffer]});  // the native function still detaches what it is told to transfer
      return {ours: !String(structuredClone).includes('[native code]'),
              primitives: [structuredClone('s'), structuredClone(3.5), structuredClone(null), structuredClone(true)],
              copied: c !== o && c.a !== o.a && c.a[1] !== o.a[1] && JSON.stringify(c.a) === JSON.stringify(o.a),
              date: c.d instanceof Date && c.d !== o.d && c.d.getTime() === 0, threw, none,
              negativeZero: Object.is(structuredClone(-0), -0), transferred: buffer.byteLength === 0};
    }""")
    assert got == {"ours": True, "primitives": ["s", 3.5, None, True], "copied": True, "date": True,
                   "threw": "DataCloneError", "none": "TypeError", "negativeZero": True, "transferred": True}
    pg.context.close()


def wait_settled(pg) -> None:
    """The run has ended and its closing messages (which repeat the final text and draw the last
    step's figures) have landed, so a click now is not overwritten by them."""
    wait_done(pg)
    last = int(stats(pg).split(" steps")[0].split()[-1]) - 1
    pg.wait_for_function("(s) => document.querySelector('#tree-plot .gtitle')?.textContent.startsWith('step ' + s + ':')",
                         arg=last, timeout=60_000)
    pg.wait_for_timeout(1000)


def tree_title(pg) -> str:
    return pg.evaluate("document.querySelector('#tree-plot .gtitle')?.textContent || ''")


def x_range(pg) -> list[float]:
    return pg.evaluate("document.querySelector('#tree-plot .js-plotly-plot')._fullLayout.xaxis.range")


CHAR_AT_JS = """(frac) => {
  const pre = document.querySelector('#out-text pre.out'), box = pre.getBoundingClientRect();
  const w = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT), chars = [];
  while (w.nextNode()) for (let i = 0; i < w.currentNode.length; i++) chars.push([w.currentNode, i]);
  const r = document.createRange();
  for (let k = Math.floor((chars.length - 1) * frac); k >= 0; k--) {
    const [node, i] = chars[k];
    r.setStart(node, i); r.setEnd(node, i + 1);
    const b = r.getBoundingClientRect();
    if (b.width > 3 && b.top >= box.top && b.bottom <= box.bottom)
      return [b.left + b.width / 2 - box.left, b.top + b.height / 2 - box.top];
  }
  return null;
}"""


def click_text(pg, frac: float) -> int:
    """Click a visible character about `frac` of the way into the output text; returns the step the
    page then marks, once the step tree shows it."""
    x, y = pg.evaluate(CHAR_AT_JS, frac)
    pg.evaluate("document.querySelector('#out-text mark.sel')?.removeAttribute('data-step')")  # the last mark
    pg.locator("#out-text pre.out").click(position={"x": x, "y": y})
    pg.wait_for_selector("#out-text mark.sel[data-step]", state="attached", timeout=30_000)
    step = int(pg.locator("#out-text mark.sel").get_attribute("data-step"))
    pg.wait_for_function("(s) => document.querySelector('#tree-plot .gtitle')?.textContent.startsWith('step ' + s + ':')",
                         arg=step, timeout=30_000)
    return step


def test_decode_text_is_light_a_click_selects_its_step_the_wheel_zooms_and_pause_holds(browser, app_url):
    """After a long run: the text is one node (three with a step marked); a click selects the step
    under it; the wheel zooms the step tree (the page does not scroll); Pause holds the step, a tick in
    flight or not; Load run gives back the prompt and tree."""
    pg = open_page(browser, app_url)
    errors = []  # uncaught exceptions in the page (a plot purged mid-draw threw one per figure and click)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    set_number(pg, "max new tokens", 600)
    pg.get_by_role("button", name="Generate").click()
    wait_settled(pg)
    assert "stopped: length" in stats(pg)
    assert pg.evaluate("document.querySelector('#out-text pre.out').childNodes.length") == 1
    step = click_text(pg, 0.02)
    assert pg.evaluate("document.querySelector('#out-text pre.out').childNodes.length") <= 3  # before, mark, after
    later = click_text(pg, 0.3)
    assert later > step

    pg.locator("#tree-plot").scroll_into_view_if_needed()
    box = pg.locator("#tree-plot .nsewdrag").first.bounding_box()
    full, scroll = x_range(pg), pg.evaluate("window.scrollY")
    pg.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    pg.mouse.wheel(0, -400)
    pg.wait_for_timeout(1000)
    zoomed = x_range(pg)
    assert zoomed[1] - zoomed[0] < 0.97 * (full[1] - full[0]), (full, zoomed)
    assert pg.evaluate("window.scrollY") == scroll  # the wheel zoomed the tree, it did not scroll the page

    for _ in range(3):  # Pause holds, whether or not a tick was in flight when it was pressed
        pg.get_by_role("button", name="▶ play").click()
        pg.wait_for_timeout(1400)
        pg.get_by_role("button", name="⏸ pause").click()
        pg.wait_for_timeout(900)  # a tick that was in flight lands
        held = tree_title(pg)
        pg.wait_for_timeout(2000)
        assert tree_title(pg) == held and pg.get_by_role("button", name="▶ play").is_visible()

    prompt = pg.get_by_label("prompt", exact=True)
    prompt.fill("something else")
    choose(pg, "tree", "chain_2")
    pg.get_by_text("calibration, downloads and saved runs").click()
    pg.get_by_label("saved runs (newest first)").click()
    pg.locator("[role=option]").first.click()
    pg.get_by_role("button", name="Load run").click()
    pg.wait_for_selector("text=loaded run", timeout=30_000)
    pg.wait_for_timeout(500)
    assert prompt.input_value() == "def read_config(path):"
    assert pg.get_by_label("tree", exact=True).first.input_value() == MODEL_TREE  # the run's tree: the model's default
    pg.screenshot(path=str(ART / "decode.png"), full_page=True)
    assert errors == []
    pg.context.close()


def test_the_zoom_stays_when_another_step_is_selected(browser, app_url):
    pg = open_page(browser, app_url)
    set_number(pg, "max new tokens", 96)
    pg.get_by_role("button", name="Generate").click()
    wait_settled(pg)
    pg.locator("#tree-plot").scroll_into_view_if_needed()
    box = pg.locator("#tree-plot .nsewdrag").first.bounding_box()
    pg.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    pg.mouse.wheel(0, -400)
    pg.wait_for_timeout(1000)
    zoomed = x_range(pg)
    click_text(pg, 0.05)
    assert x_range(pg) == pytest.approx(zoomed)
    pg.context.close()


def test_a_second_generate_while_one_runs_says_so(browser, app_url):
    pg = open_page(browser, app_url)
    set_number(pg, "max new tokens", 384)
    pg.get_by_role("button", name="Generate").click()
    pg.wait_for_function("document.querySelector('#stats').innerText.includes('tokens,')", timeout=60_000)
    pg.get_by_role("button", name="Generate").click()
    pg.wait_for_selector("text=this page already has a job queued or running", timeout=10_000)
    pg.get_by_role("button", name="Stop").click()
    pg.wait_for_function("document.querySelector('#stats').innerText.includes('stopped by user')", timeout=60_000)
    pg.context.close()


def test_dom_stays_flat_across_runs(browser, app_url):
    """Three runs with a step selected after each: the page's DOM nodes and listeners (detached ones
    included, after a garbage collection) do not grow from the first run to the third."""
    from workbench.uibench import dom_counts

    pg = open_page(browser, app_url)
    cdp = pg.context.new_cdp_session(pg)
    choose(pg, "tree", "mc_sim_7b_63")
    set_number(pg, "max new tokens", 300)
    counts = []
    for _ in range(3):
        pg.get_by_role("button", name="Generate").click()
        pg.wait_for_function("!document.querySelector('#stats').innerText.includes('stopped')", timeout=60_000)
        wait_settled(pg)
        click_text(pg, 0.02)
        pg.wait_for_timeout(500)
        counts.append(dom_counts(pg, cdp))
    assert counts[2]["nodes"] - counts[0]["nodes"] <= 300, counts  # before: +20,000 a run
    assert counts[2]["listeners"] - counts[0]["listeners"] <= 50, counts
    # a fresh page already holds about 900 nodes outside the document (the frameworks' cached templates
    # and fragments), about 1,250 once the plots are drawn: what must not happen is their growth
    assert counts[2]["detached"] - counts[0]["detached"] <= 300, counts
    pg.context.close()


def _luminance(rgb: str) -> float:
    r, g, b = (int(v) / 255 for v in rgb[rgb.index("(") + 1:rgb.index(")")].split(",")[:3])
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in (r, g, b)]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def test_dark_mode_keeps_the_text_readable_and_the_plots_dark(browser, app_url):
    pg = browser.new_context(viewport={"width": 1400, "height": 1000}, color_scheme="dark").new_page()
    pg.goto(app_url + "?__theme=dark")
    pg.wait_for_selector("text=Generate", timeout=120_000)
    set_number(pg, "max new tokens", 300)
    pg.get_by_role("button", name="Generate").click()
    wait_settled(pg)
    click_text(pg, 0.02)
    fg, bg = pg.evaluate("""() => { const s = getComputedStyle(document.querySelector('#out-text pre.out'));
                                     return [s.color, s.backgroundColor]; }""")
    hi, lo = sorted((_luminance(fg), _luminance(bg)), reverse=True)
    assert (hi + 0.05) / (lo + 0.05) >= 4.5, (fg, bg)  # WCAG AA contrast
    for plot in ("#tree-plot", "#head-plot", "#run-plot"):
        svg_bg = pg.evaluate(f"getComputedStyle(document.querySelector('{plot} .main-svg')).backgroundColor")
        assert svg_bg == "rgba(0, 0, 0, 0)" or _luminance(svg_bg) < 0.2, (plot, svg_bg)
        area = pg.evaluate(f"getComputedStyle(document.querySelector('{plot} .bg') || document.body).fill")
        assert _luminance(area) < 0.2, (plot, area)
    # every subplot's tick labels (the head panel's heads 2-4 are y2tick..y4tick), not only the first's
    ticks = pg.evaluate("""() => [...document.querySelectorAll('#head-plot .xaxislayer-above text, '
                                  + '#head-plot .yaxislayer-above text')].map(t => getComputedStyle(t).fill)""")
    assert len(ticks) > 8 and all(_luminance(f) > 0.5 for f in ticks), ticks
    pg.screenshot(path=str(ART / "decode_dark.png"), full_page=True)
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
    # still every node: no figure drawn with the view from before the box was checked landed after it
    pg.get_by_role("tab", name="Decode").click()
    assert f"{n} drawn" in pg.locator("#tree-plot .gtitle").text_content()
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
