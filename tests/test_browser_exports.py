"""Every figure and table format downloaded from the app in Chromium and opened the way a reader
would: SVG parsed as XML, PNG by its signature and print size, HTML holding the plot, CSV through the
csv module, JSON through json.loads refusing NaN. Also the screenshots of the model header, the
run-vs-run view, the static-vs-dynamic comparison and a recorded batch sweep (docs/screens/). Skipped without Chromium."""

import csv
import io
import json
import re
import socket
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from engine.accept import RULES
from workbench.browser import have_chromium, launch, open_page, set_number
from workbench.exports import LAYOUT_PX, PRINT_DPI, PRINT_INCHES

pw = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.skipif(not have_chromium(), reason="Debian chromium is not installed")
SCREENS = Path(__file__).resolve().parent.parent / "docs" / "screens"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _no_nan(text: str):
    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def app_url(demo_engine, tmp_path_factory):
    from engine.loading import DEMO_DIR
    from workbench.app import serve
    from workbench.core import Workbench
    from workbench.tabs.decode import DecodeTab

    wb = Workbench(demo_engine, tmp_path_factory.mktemp("exports"), DEMO_DIR / "tune_traces.jsonl")
    decode, session = DecodeTab(wb), wb.sessions.get("setup")
    for tree in ("demo_tuned", "mc_sim_7b_63"):  # two saved runs of one prompt for the run-vs-run view
        list(decode.decode(session, "def read_config(path):", tree, "", "medusa", "greedy", 0.7, 1.0, 0, 48))
    app, url = serve(wb, port=_free_port(), block=False)
    yield url
    app.close()


@pytest.fixture(scope="module")
def page(app_url):
    with pw.sync_playwright() as p:
        b = launch(p)
        pg = open_page(b, app_url)
        yield pg
        b.close()


def download(pg, elem_id: str) -> bytes:
    """The file a DownloadButton gives on its first click."""
    with pg.expect_download(timeout=30_000) as d:
        pg.locator(f"#{elem_id}").click()
    return Path(d.value.path()).read_bytes()


def check_table(pg, stem: str, headers_start: str) -> list[dict]:
    rows = list(csv.reader(io.StringIO(download(pg, f"{stem}-csv").decode())))
    assert rows[0][0] == headers_start and len(rows) > 1
    data = _no_nan(download(pg, f"{stem}-json").decode())
    assert isinstance(data, list) and len(data) == len(rows) - 1 and list(data[0])[0] == headers_start
    return data


def check_figures(pg, stem: str, names: list[str]) -> None:
    pg.locator(f"#{stem}-export").click()
    links = pg.locator(f"#{stem}-files a")
    links.nth(3 * len(names) - 1).wait_for(timeout=120_000)
    got = {}
    for i in range(links.count()):
        href = links.nth(i).get_attribute("href")
        got[href.rsplit("/", 1)[-1]] = pg.request.get(href).body()
    for name in names:
        ET.fromstring(got[f"{name}.svg"])  # parses as XML
        png = got[f"{name}.png"]
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", png[16:24])
        assert width == round(PRINT_DPI * PRINT_INCHES[0]) and height == round(width * LAYOUT_PX[1] / LAYOUT_PX[0])
        check_html_draws(pg, got[f"{name}.html"].decode())


def check_html_draws(pg, page_html: str) -> None:
    """Open an exported HTML figure offline, as a reader would: its inline plotly.js draws the figure,
    with no page error (a figure whose data did not survive the export draws no trace)."""
    viewer = pg.context.new_page()
    viewer.route(re.compile(r"^https?://"), lambda route: route.abort())  # offline, even with a network
    errors = []
    viewer.on("pageerror", lambda e: errors.append(str(e)))
    try:
        viewer.set_content(page_html, wait_until="load")
        viewer.wait_for_selector(".js-plotly-plot .main-svg", timeout=60_000)
        traces = viewer.evaluate("document.querySelector('.js-plotly-plot')._fullData.length")
    finally:
        viewer.close()
    assert traces > 0 and not errors, (traces, errors)


def test_the_model_header_and_selector(page):
    header = page.locator("#model-header").inner_text()
    for part in ("model", "demo", "4 Medusa heads", "float32", "cpu", "sdpa"):
        assert part in header
    page.locator("#model-pick input").click()
    page.wait_for_timeout(400)
    page.screenshot(path=str(SCREENS / "model_selector.png"), clip={"x": 0, "y": 0, "width": 1400, "height": 330})
    page.keyboard.press("Escape")


def test_decode_node_table_and_figures_download_in_every_format(page):
    page.get_by_role("button", name="Generate").click()
    page.wait_for_function("document.querySelector('#stats').innerText.includes('stopped')", timeout=240_000)
    page.wait_for_timeout(1500)
    rows = check_table(page, "nodes", "node")
    last = page.locator("#step-slider input[type=number]").input_value()
    assert rows and last  # the selected (last) step's table, on the first click
    page.get_by_text("calibration, downloads and saved runs").click()
    check_figures(page, "decode", ["step_tree", "heads", "run", "acceptance", "calibration"])


def test_compare_rules_and_static_vs_dynamic_download(page):
    page.get_by_role("tab", name="Compare").click()
    page.get_by_role("button", name="Compare", exact=True).click()
    page.wait_for_function("document.querySelector('#cmp-msg').innerText.includes('tokens/step')", timeout=240_000)
    check_table(page, "compare", "prompt")
    page.locator("#dyn-sizes textarea, #dyn-sizes input").first.fill("8,16")
    page.locator("#dyn-btn").click()
    page.wait_for_function("document.querySelector('#dyn-msg').innerText.includes('AR runs')", timeout=240_000)
    data = check_table(page, "static_vs_dynamic", "nodes")
    assert {r["dynamic rule"] for r in data} == {"product", "calibrated"}
    page.wait_for_timeout(1000)
    page.locator("#dyn-plot").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENS / "static_vs_dynamic.png"), full_page=True)
    check_figures(page, "dynamic", ["static_vs_dynamic"])


def test_a_recorded_batch_sweep_shows_and_downloads(page):
    page.get_by_role("tab", name="Compare").click()
    page.locator("#sweep-btn").click()
    page.wait_for_function("document.querySelector('#sweep-msg').innerText.includes('batch')", timeout=60_000)
    msg = page.locator("#sweep-msg").inner_text()
    assert "✗" not in msg and ("AR beats every tree" in msg or "a tree beats AR" in msg)
    data = check_table(page, "batch_sweep", "batch")
    assert [r["batch"] for r in data] == sorted(r["batch"] for r in data)
    page.wait_for_timeout(1000)
    page.locator("#sweep-plot").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENS / "batch_sweep.png"), full_page=True)
    check_figures(page, "sweep", ["batch_sweep"])


def test_runs_side_by_side_and_their_figures(page):
    page.get_by_role("tab", name="Runs").click()
    page.get_by_role("button", name="↻ runs").click()
    page.wait_for_timeout(800)
    for label, nth in (("run A", 0), ("run B", 1)):
        dd = page.get_by_label(label)
        dd.click()
        page.wait_for_timeout(300)
        page.locator("ul[role=listbox] li").nth(nth).click()
        page.wait_for_timeout(300)
    page.locator("#runs-show").click()
    page.wait_for_function("document.querySelector('#runs-summary').innerText.includes('same prompt')", timeout=60_000)
    page.wait_for_timeout(1500)
    page.screenshot(path=str(SCREENS / "runs_side_by_side.png"), full_page=True)
    check_figures(page, "runs", ["runs_tokens_per_step", "runs_head_accuracy"])


def test_tune_step_times_download(page):
    page.get_by_role("tab", name="Tune").click()
    page.get_by_label("sizes to time (nodes)").fill("4,8")
    set_number(page, "time budget", 5)
    page.get_by_role("button", name="Measure step times here").click()
    page.wait_for_function("document.querySelector('#lat-msg').innerText.includes('confidence')", timeout=240_000)
    data = check_table(page, "step_times", "nodes")
    assert [r["nodes"] for r in data][0] in ("AR", 0)


def test_the_tree_editors_figure_exports(page):
    page.get_by_role("tab", name="Tree editor").click()
    page.locator("#editor-plot .js-plotly-plot").wait_for(timeout=60_000)
    check_figures(page, "editor", ["editor_tree"])


def test_tunes_figures_export_after_collecting_and_choosing_the_size(page):
    """Head accuracy (after Collect) and the E(n)/t(n) curve (after an optimisation that chose the size
    by the step times measured in test_tune_step_times_download)."""
    page.get_by_role("tab", name="Tune").click()
    set_number(page, "prompts", 2)
    set_number(page, "tokens per prompt", 16)
    page.get_by_role("button", name="Collect AR traces").click()
    page.wait_for_function("document.querySelector('#collect-msg').innerText.includes('collected')", timeout=240_000)
    page.get_by_label("choose the size by E(n)/t(n)").check()
    page.get_by_role("button", name="Optimise → editor").click()
    page.locator("#tune-size-plot .js-plotly-plot").wait_for(timeout=120_000)
    check_figures(page, "tune", ["head_accuracy", "tree_size"])


def test_the_rules_table_downloads(page):
    page.get_by_role("tab", name="Compare").click()
    set_number(page, "prompts", 1)
    set_number(page, "samples per prompt and rule", 4)
    page.get_by_role("button", name="Compare acceptance rules").click()
    page.wait_for_function("document.querySelector('#rules-msg').innerText.includes('samples')", timeout=240_000)
    data = check_table(page, "rules", "rule")
    assert set(RULES) | {"AR vs AR"} == {r["rule"] for r in data}
