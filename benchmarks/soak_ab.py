"""A/B memory soak: `python benchmarks/soak_ab.py TREE MINUTES` runs workbench.loadtest's soak against
the app of another checkout TREE (e.g. `git worktree add /tmp/before HEAD~1`), 2 client threads, and
prints the server's RSS curve as JSON. Run two at once, one per tree, so both see the same load."""

import json
import sys
import tempfile
from pathlib import Path

tree, minutes = Path(sys.argv[1]).resolve(), float(sys.argv[2])
sys.path.insert(0, str(tree))
import workbench.loadtest as lt  # noqa: E402  (the checkout's own loadtest and app)

lt.ROOT = tree
proc, url = lt.start_server(Path(tempfile.mkdtemp()))
try:
    out = lt.soak(url, minutes, proc.pid, workers=2)
finally:
    proc.terminate()
print(json.dumps({"tree": str(tree), "minutes": minutes, "requests": out["requests"], "after_2_min": out["after_2_min"],
                  "rss_mib_curve": out["rss_mib_curve"]}))
