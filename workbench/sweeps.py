"""Recorded batch sweeps (`python -m engine bench --part batch`): read one file for the Compare tab's
"where does Medusa stop paying" curve. The benchmark prints a JSON object whose `rows` hold, per batch
size, our AR's tokens/s and each tree's; older files key the trees by node count instead of by name.
Anything else is refused in one line naming what is missing, before a figure is drawn."""

from __future__ import annotations

import math
from pathlib import Path

from trees.io import JsonInputError, read_json_file

from .session import UserError

RECORDED_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
SWEEP_HEADERS = ["batch", "requests", "AR tokens/s", "best tree", "best tokens/s", "best over AR"]
MAX_BATCH = 2**20  # far past any batch run; plotly's JSON cannot carry an integer past 64 bits


def recorded_sweeps(folder: Path = RECORDED_DIR) -> list[str]:
    """The batch sweeps recorded in the repository (`benchmarks/*batch*.json`), sorted by name."""
    return sorted(str(p) for p in folder.glob("*batch*.json")) if folder.is_dir() else []


def read_sweep(path: str | Path) -> dict:
    """The sweep in `path`, checked: -> {"title", "batches", "ar": [tokens/s], "trees": {name: [tokens/s]},
    "requests": [count or None]}. A tree missing at some batch size gets None there."""
    name = Path(path).name
    try:
        data = read_json_file(path)
    except JsonInputError as e:
        raise UserError(str(e)) from None
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise UserError(f"{name}: not a batch sweep (no 'rows'; write one with python -m engine bench --part batch)")
    try:
        rows = sorted(rows, key=_batch)
        batches = [_batch(r) for r in rows]
        ar = [float(r["ar"]["tokens_per_s"]) for r in rows]
        requests = [_requests(r["ar"].get("requests")) for r in rows]
        keys = list(dict.fromkeys(str(t) for r in rows for t in r["medusa"]))
        trees = {_tree_name(t): [_tokens_per_s(r["medusa"].get(t)) for r in rows] for t in keys}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise UserError(f"{name}: a row of this batch sweep lacks a field or has a wrong one ({type(e).__name__}: {e})"
                        ) from None
    if len(set(batches)) != len(batches) or min(batches) < 1 or max(batches) > MAX_BATCH:
        raise UserError(f"{name}: batch sizes must be distinct, at least 1 and at most {MAX_BATCH}, got {batches}")
    if any(not 0 < v < math.inf for v in ar) or any(v is not None and not 0 < v < math.inf for vs in trees.values() for v in vs):
        raise UserError(f"{name}: every tokens/s must be a positive finite number")
    # the file's own words go into a one-line Markdown message: whitespace collapsed, at most 80 characters each
    what = ", ".join(" ".join(str(data[k]).split())[:80] for k in ("model", "device", "dtype", "date") if data.get(k))
    return {"title": f"{name}" + (f" ({what})" if what else ""), "batches": batches, "ar": ar, "trees": trees,
            "requests": requests}


def _json_int(value: object, what: str) -> int:
    """A count the file must hold as a JSON integer: int() would read a batch of 1.7 as 1 and fail on
    Infinity with an OverflowError that the caller does not expect."""
    if type(value) is not int:
        raise ValueError(f"{what} {value!r} is not a whole number")
    return value


def _batch(row: dict) -> int:
    return _json_int(row["batch"], "batch")


def _requests(n: object) -> int | None:
    """How many requests a batch size decoded (files written before they all decoded the same have none)."""
    return None if n is None else _json_int(n, "requests")


def _tree_name(key: str) -> str:
    """Files written before `--trees` name each tree by its node count."""
    return f"{key} nodes" if key.isdigit() else key


def _tokens_per_s(cell: object) -> float | None:
    return None if cell is None else float(cell["tokens_per_s"])


def sweep_rows(sweep: dict) -> list[list]:
    """One table row per batch size: AR's tokens/s, the fastest tree there and its ratio over AR."""
    out = []
    for i, (b, ar) in enumerate(zip(sweep["batches"], sweep["ar"])):
        at = {t: v[i] for t, v in sweep["trees"].items() if v[i] is not None}
        best = max(at, key=at.get) if at else None
        out.append([b, sweep["requests"][i], ar, best, at.get(best), round(at[best] / ar, 3) if best else None])
    return out
