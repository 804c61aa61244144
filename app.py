"""`python app.py [--model PATH|demo] [--port 7860] [--host 127.0.0.1] [--backend ...]`: the workbench."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def port(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"a port is in 1..65535, got {v}")
    return v


def parser() -> argparse.ArgumentParser:
    from engine.cli import Parser
    from engine.options import add_model_arguments, positive_int

    p = Parser(prog="python app.py", description=__doc__)
    add_model_arguments(p)
    p.add_argument("--port", type=port, default=7860)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--share", choices=["never"], default="never", help="public share links are never made")
    p.add_argument("--data-dir", default=None, help="saved trees, runs and trace pools (default ~/.medusa-workbench)")
    p.add_argument("--traces", default=None, help="AR traces the predictions start from (default: the demo's)")
    p.add_argument("--max-models", type=positive_int, default=2,
                   help="models kept loaded at once for the model selector (least recently used idle one let go)")
    return p


def loader(a: argparse.Namespace):
    """Loads the selector's other models with the app's device, dtype and backend options (their own
    heads, found beside them; --heads/--no-heads belong to the model the app started with)."""
    from engine.options import load_from_arguments

    def load(name: str):
        return load_from_arguments(argparse.Namespace(**{**vars(a), "model": name, "heads": None, "no_heads": False}))

    return load


def main(argv: list[str] | None = None) -> int:
    from workbench.memory import limit_heap_growth

    limit_heap_growth()  # before torch and Gradio start their threads (each would make its own arena)
    a = parser().parse_args(argv)
    import engine
    from engine.loading import DEMO_DIR
    from engine.options import load_from_arguments
    from workbench.app import LOOPBACK, serve
    from workbench.core import Workbench, default_data_dir

    if a.host not in LOOPBACK:
        print(f"warning: binding {a.host}: anyone who can reach this address can use the app", file=sys.stderr)
    try:
        # the engine is handed over, not kept here: the model selector's cache may let it go
        wb = Workbench(load_from_arguments(a), Path(a.data_dir) if a.data_dir else default_data_dir(),
                       Path(a.traces) if a.traces else (DEMO_DIR / "tune_traces.jsonl" if a.model == "demo" else None),
                       loader=loader(a), model=a.model, max_engines=a.max_models)
        serve(wb, a.host, a.port)
    except (engine.ModelLoadError, ValueError, OSError) as e:
        print(f"error: {' '.join(str(e).splitlines())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
