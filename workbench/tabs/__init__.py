"""The tabs of the page, one file each, so that a new tab is one new file here.

A tab module defines `TAB`, its class, with a `title` and an `order` (its place, left to right), built
from the Workbench (`TAB(wb)`). Its plain methods are what the tab's events do (testable without a
browser); `layout(page)` builds its part of the page, `wire(page)` its events (after every tab's
layout, so a tab may use another's components), and `on_load(session, editor_text)` returns the
updates its components take when a page opens, as {component: value}, of the components that
`load_outputs()` lists.
"""

from __future__ import annotations

import importlib
import pkgutil


def tab_classes() -> list[type]:
    """Every tab module's TAB, in page order."""
    modules = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)]
    return sorted((m.TAB for m in modules if hasattr(m, "TAB")), key=lambda cls: cls.order)
