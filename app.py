"""`python app.py [--model PATH|demo] [--port 7860] [--host 127.0.0.1] [--share never]`: the workbench."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="demo")
    p.add_argument("--heads", default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--share", choices=["never"], default="never", help="public share links are never made")
    p.add_argument("--data-dir", default=None, help="where saved trees go (default ~/.medusa-workbench)")
    a = p.parse_args(argv)
    import engine
    from workbench.app import LOOPBACK, serve
    from workbench.handlers import Workbench, default_data_dir

    if a.host not in LOOPBACK:
        print(f"warning: binding {a.host}: anyone who can reach this address can use the app", file=sys.stderr)
    try:
        eng = engine.load(a.model, heads=a.heads, device=a.device)
    except engine.ModelLoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    serve(Workbench(eng, Path(a.data_dir) if a.data_dir else default_data_dir()), a.host, a.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
