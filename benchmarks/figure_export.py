"""Figure images through the kept browser (workbench/figure_browser.py) against one browser per figure,
and the kept browser's memory (PSS of its processes, from /proc: Linux only). Prints JSON.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/figure_export.py
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import plotly.graph_objects as go  # noqa: E402
import plotly.io as pio  # noqa: E402

from workbench import exports, figure_browser  # noqa: E402

FIGURES = 5


def figure(i: int) -> go.Figure:
    return go.Figure(go.Scatter(x=list(range(50)), y=[(j * i) % 7 for j in range(50)]), layout={"title": f"figure {i}"})


def seconds(draw) -> list[float]:
    out = []
    for i in range(FIGURES):
        t0 = time.perf_counter()
        draw(figure(i))
        out.append(round(time.perf_counter() - t0, 3))
    return out


def descendants(pid: int) -> list[int]:
    children = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    todo, out = [pid], []
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def pss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return round(total / 1024, 1)


def main() -> None:
    os.environ.setdefault("BROWSER_PATH", exports.CHROMIUM)
    width, height = exports.LAYOUT_PX
    own = seconds(lambda f: pio.to_image(f, format="svg", width=width, height=height))  # a browser per figure
    kept = seconds(lambda f: exports.figure_image(f, "svg"))  # the first one starts the kept browser
    pids = descendants(os.getpid())
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2),
                      "svg_s_browser_per_figure": own, "svg_s_kept_browser": kept,
                      "kept_median_after_first_s": round(statistics.median(kept[1:]), 3),
                      "kept_browser_processes": len(pids), "kept_browser_pss_mib": pss_mib(pids),
                      "kept": figure_browser.kept_browser() is not None}))


if __name__ == "__main__":
    main()
