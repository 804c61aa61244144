"""Driving the app in Debian's Chromium with Playwright: what the browser tests, `uibench`,
`loadtest` and `screenshots` share. Playwright's own browser download cannot work offline, so the
system chromium is launched through `executable_path`."""

from __future__ import annotations

import os
import shutil

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1400, "height": 1000}


def have_chromium(path: str = CHROMIUM) -> bool:
    return os.path.exists(path)


def launch(playwright, chromium: str = CHROMIUM):
    return playwright.chromium.launch(executable_path=chromium, args=FLAGS)


def open_page(browser, url: str, init_script: str | None = None, timeout_ms: int = 120_000):
    """A page in a new browser context (a new Gradio session), loaded and ready."""
    pg = browser.new_context(viewport=VIEWPORT, accept_downloads=True).new_page()
    if init_script:
        pg.add_init_script(init_script)
    pg.goto(url)
    pg.wait_for_selector("text=Generate", timeout=timeout_ms)
    return pg


def number_box(pg, label_part: str, timeout_ms: int = 60_000):
    """The shown number input whose label contains `label_part` (tabs visited earlier stay in the page,
    hidden, and two tabs may have a control of the same name). Waits for it: on a loaded machine the
    page shows its Generate button before every control of the tab is laid out."""
    found = pg.wait_for_function(
        """part => 1 + [...document.querySelectorAll('input[type=number]')]
                 .findIndex(e => e.checkVisibility() && (e.getAttribute('aria-label') || '').includes(part))""",
        arg=label_part, timeout=timeout_ms)
    return pg.locator("input[type=number]").nth(found.json_value() - 1)


def set_number(pg, label_part: str, value) -> None:
    box = number_box(pg, label_part)
    box.fill(str(value))
    box.press("Enter")
    box.blur()
    pg.wait_for_timeout(400)


def choose(pg, label: str, value: str, nth: int = 0, exact: bool = False) -> str:
    """Pick `value` in the dropdown labelled `label`; returns what the dropdown then shows."""
    dd = pg.get_by_label(label, exact=exact).nth(nth)
    dd.click()
    dd.fill(value)
    pg.wait_for_timeout(300)
    pg.keyboard.press("Enter")
    pg.wait_for_timeout(300)
    return dd.input_value()
