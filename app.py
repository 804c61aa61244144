"""`python app.py [--model PATH|demo] [--port 7860] [--host 127.0.0.1] [--share never]`: the workbench."""

from __future__ import annotations

import argparse
import os
import sys

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
    from workbench.app import build_app
    from workbench.handlers import Workbench, default_data_dir

    if a.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: binding {a.host}: anyone who can reach this address can use the app", file=sys.stderr)
    try:
        eng = engine.load(a.model, heads=a.heads, device=a.device)
    except engine.ModelLoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from pathlib import Path

    wb = Workbench(eng, Path(a.data_dir) if a.data_dir else default_data_dir())
    app = build_app(wb)
    app.queue(default_concurrency_limit=1, max_size=64)
    app.launch(server_name=a.host, server_port=a.port, share=False, show_error=False,
               allowed_paths=[str(wb.tree_dir)], max_file_size="1mb")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
