"""The tabs of the page, one file each: a class whose plain methods are what the tab's events do
(testable without a browser) and whose `layout` / `wire` build its part of the page (page.py)."""
