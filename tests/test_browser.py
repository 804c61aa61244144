"""The app in Debian's Chromium driven by Playwright: load, decode, scrub, bad edit, save + download.

Screenshots go to artifacts/ (look at them). Skipped when chromium or playwright is missing.
"""

import json
import os
import shutil
import socket
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pw = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium is not installed")
ART = Path(__file__).resolve().parent.parent / "artifacts"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app_url(demo_engine, tmp_path_factory):
    from workbench.app import serve
    from workbench.handlers import Workbench

    app, url = serve(Workbench(demo_engine, tmp_path_factory.mktemp("browser")), port=_free_port(), block=False)
    yield url
    app.close()


@pytest.fixture(scope="module")
def page(app_url, tmp_path_factory):
    ART.mkdir(exist_ok=True)
    with pw.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        ctx = browser.new_context(viewport={"width": 1400, "height": 1800}, accept_downloads=True)
        pg = ctx.new_page()
        pg.console_errors = []
        pg.on("console", lambda m: m.type == "error" and pg.console_errors.append(m.text))
        pg.goto(app_url)
        pg.wait_for_selector("text=Generate", timeout=60_000)
        yield pg
        browser.close()


def test_loads_without_console_errors(page):
    assert page.title() == "medusa-workbench"
    errors = [e for e in page.console_errors if "favicon" not in e]
    assert errors == []


def test_decode_streams_text_and_draws_tree_and_scrubs(page):
    page.get_by_role("button", name="Generate").click()
    page.wait_for_selector("text=stopped: length", timeout=120_000)
    out = page.locator("pre").first.inner_text()
    assert len(out) > 20
    plot_title = page.locator(".js-plotly-plot .gtitle").first
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 2", timeout=30_000)
    last_title = plot_title.text_content()
    assert last_title.startswith("step ")
    page.screenshot(path=str(ART / "decode.png"), full_page=True)
    labels = page.eval_on_selector_all("input[type=number]", "els => els.map(e => e.getAttribute('aria-label'))")
    box = page.locator("input[type=number]").nth(next(i for i, a in enumerate(labels) if a and "step" in a))
    box.fill("1")
    box.press("Enter")
    page.wait_for_function("(t) => document.querySelector('.js-plotly-plot .gtitle').textContent !== t",
                           arg=last_title, timeout=30_000)
    assert plot_title.text_content().startswith("step 1")


def test_invalid_edit_shows_rule_and_saved_tree_downloads(page, tmp_path):
    page.get_by_role("tab", name="Tree editor").click()
    editor = page.locator(".cm-content").first
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.type("[[0], [1, 2]]")
    page.wait_for_selector("text=prefix [1] is missing", timeout=30_000)
    page.screenshot(path=str(ART / "editor_invalid.png"), full_page=True)
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.type("[[0], [1], [0, 0], [0, 1]]")
    page.wait_for_selector("text=valid: 4 nodes", timeout=30_000)
    page.get_by_label("save as").fill("browser_tree")
    page.get_by_role("button", name="Save").click()
    page.wait_for_selector("text=saved as saved/browser_tree", timeout=30_000)
    page.screenshot(path=str(ART / "editor.png"), full_page=True)
    with page.expect_download() as dl:
        page.locator('a[download="browser_tree.json"]').first.click()
    f = tmp_path / "t.json"
    dl.value.save_as(f)
    data = json.loads(f.read_text())
    assert data["medusa_choices"] == [[0], [1], [0, 0], [0, 1]] and data["schema_version"] == 1
    page.screenshot(path=str(ART / "editor.png"), full_page=True)
