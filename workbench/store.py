"""What the workbench keeps on disk under its data folder, written atomically:

  trees/NAME.json          saved trees (schema-1 JSON, mode 0644), in every tree dropdown
  runs/ID/trace.jsonl      the last MAX_RUNS decode runs: step traces (docs/trace-schema.md) ...
  runs/ID/settings.json    ... and the settings, text and summary of the run
  pools/NAME.jsonl         collected AR traces (Tune), the estimators' input
  downloads/TOKEN/FILE     the newest MAX_DOWNLOADS files made for a download button (tables,
                           figures); emptied at start, so nothing is left in the system's /tmp
  .staging/                temp files and run folders before their rename; orphans from a killed
                           process are removed at start, and this folder is never served

A run folder appears whole or not at all: it is written in .staging/ and renamed into runs/, so a
full or read-only disk leaves nothing behind. A damaged run folder (bad settings.json) is skipped
and reported, never an error in the runs list.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from pathlib import Path

import trees

MAX_RUNS = 50
MAX_POOLS = 20
MAX_DOWNLOADS = 32


class StoreError(ValueError):
    """A name or file the store cannot use; shown to the user."""


def safe_name(name: str) -> str:
    """A file stem with no path parts: letters, digits, '-', '_' and '.', not starting with '.'."""
    clean = re.sub(r"[^A-Za-z0-9._-]+", "_", (name or "").strip()).strip("._")[:64] if isinstance(name, str) else ""
    if not clean:
        raise StoreError("give it a name (letters, digits, '-', '_')")
    return clean


class Store:
    def __init__(self, data_dir: Path):
        self.root = Path(data_dir)
        self.trees_dir = self.root / "trees"
        self.runs_dir = self.root / "runs"
        self.pools_dir = self.root / "pools"
        self.downloads_dir = self.root / "downloads"
        self.staging = self.root / ".staging"
        for d in (self.trees_dir, self.runs_dir, self.pools_dir, self.downloads_dir, self.staging):
            d.mkdir(parents=True, exist_ok=True)
        self.damaged_runs: list[str] = []  # run folders the last list_runs skipped
        self.clean_orphans()

    def clean_orphans(self) -> int:
        """Remove what a killed process left: temp files and half-written run folders (in staging,
        and temp files beside files from older versions), and the last session's downloads."""
        n = 0
        for d in (self.staging, self.trees_dir, self.runs_dir, self.pools_dir):
            for p in d.rglob(".*.tmp"):
                p.unlink(missing_ok=True)
                n += 1
        for d in [*self.staging.iterdir(), *self.downloads_dir.iterdir()]:
            if d.is_dir() and not d.is_symlink():
                shutil.rmtree(d, ignore_errors=True)
                n += 1
        return n

    def _write(self, path: Path, text: str) -> Path:
        return trees.write_atomic(path, text, self.staging)

    # -- trees -----------------------------------------------------------------------------------
    def tree_names(self) -> list[str]:
        return sorted(p.stem for p in self.trees_dir.glob("*.json") if not p.name.startswith("."))

    def tree_path(self, name: str) -> Path:
        return self.trees_dir / f"{safe_name(name)}.json"

    def save_tree(self, tf: trees.TreeFile, overwrite: bool = False) -> Path:
        return trees.save_tree(tf, self.tree_path(tf.name), overwrite=overwrite, tmp_dir=self.staging)

    def load_tree(self, name: str) -> trees.TreeFile:
        p = self.tree_path(name)
        if not p.exists():
            raise StoreError(f"no saved tree named {name!r}")
        return trees.load_tree(p)

    # -- runs ------------------------------------------------------------------------------------
    def save_run(self, settings: dict, traces: list[dict], text: str, finish: str | None = None) -> str:
        """Keep one finished (or stopped) run; the oldest beyond MAX_RUNS are removed. -> run id.
        StoreError (and nothing on disk) when it cannot be written."""
        run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
        tmp = self.staging / run_id
        # the trace schema's header (docs/trace-schema.md) names the rule `acceptance`; the settings say `accept`
        header = {"type": "header", "schema_version": 1, "acceptance": settings.get("accept"), **settings}
        lines = [json.dumps(header, ensure_ascii=False)] + [json.dumps(t, ensure_ascii=False) for t in traces]
        tokens = sum(len(t["accepted_tokens"]) for t in traces)
        summary = {"id": run_id, "created": time.strftime("%Y-%m-%d %H:%M:%S"), "settings": settings, "text": text,
                   "finish": finish, "steps": len(traces), "tokens": tokens, "tokens_per_step": round(tokens / max(len(traces), 1), 3)}
        try:
            tmp.mkdir(parents=True)
            self._write(tmp / "trace.jsonl", "\n".join(lines) + "\n")
            self._write(tmp / "settings.json", json.dumps(summary, ensure_ascii=False, indent=1))
            os.rename(tmp, self.runs_dir / run_id)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise StoreError(f"could not save the run ({e.strerror or e})") from None
        for old in sorted(self.runs_dir.iterdir())[:-MAX_RUNS]:
            shutil.rmtree(old, ignore_errors=True)
        return run_id

    def list_runs(self) -> list[dict]:
        """Summaries of the saved runs, newest first; damaged folders are skipped and named in
        `damaged_runs`."""
        out, damaged = [], []
        for d in sorted(self.runs_dir.iterdir(), reverse=True):
            summary = _run_summary(d)
            if summary is None:
                damaged.append(d.name)
            else:
                out.append(summary)
        self.damaged_runs = damaged
        return out

    def run_dir(self, run_id: str) -> Path:
        d = self.runs_dir / safe_name(run_id)
        if not (d / "trace.jsonl").exists():
            raise StoreError(f"no saved run {run_id!r}")
        return d

    def load_run(self, run_id: str) -> tuple[dict, list[dict]]:
        d = self.run_dir(run_id)
        summary = _run_summary(d)
        if summary is None:
            raise StoreError(f"run {run_id!r} is damaged (its settings.json cannot be read)")
        steps = [obj for _, obj in trees.stats.iter_trace_lines(d / "trace.jsonl") if obj.get("type") != "header"]
        return summary, steps

    # -- trace pools -----------------------------------------------------------------------------
    def pool_names(self) -> list[str]:
        return sorted(p.stem for p in self.pools_dir.glob("*.jsonl") if not p.name.startswith("."))

    def pool_path(self, name: str) -> Path:
        return self.pools_dir / f"{safe_name(name)}.jsonl"

    # -- downloads -------------------------------------------------------------------------------
    def write_download(self, name: str, text: str | bytes) -> Path:
        """A file for a download button, in a folder of its own; the oldest beyond MAX_DOWNLOADS go."""
        return self.write_downloads({name: text})[0]

    def write_downloads(self, files: dict[str, str | bytes]) -> list[Path]:
        """Files made together (one figure's formats, one table's), in one folder of their own."""
        d = self.downloads_dir / uuid.uuid4().hex
        d.mkdir()
        out = []
        for name, data in files.items():
            if isinstance(data, bytes):  # images: written in staging, then renamed in whole
                tmp = self.staging / f".{uuid.uuid4().hex}.tmp"
                tmp.write_bytes(data)
                out.append(Path(os.replace(tmp, d / safe_name(name)) or d / safe_name(name)))
            else:
                out.append(self._write(d / safe_name(name), data))
        for old in sorted(self.downloads_dir.iterdir(), key=lambda p: p.stat().st_mtime)[:-MAX_DOWNLOADS]:
            shutil.rmtree(old, ignore_errors=True)
        return out

    def save_pool(self, name: str, lines: list[str]) -> Path:
        p = self._write(self.pool_path(name), "\n".join(lines) + "\n")
        pools = sorted(self.pools_dir.glob("*.jsonl"), key=lambda f: f.stat().st_mtime)
        for old in pools[:-MAX_POOLS]:
            old.unlink(missing_ok=True)
        return p


def _run_summary(d: Path) -> dict | None:
    """A run folder's settings.json when it has the shape the runs list reads, else None."""
    try:
        summary = trees.read_json_file(d / "settings.json")
    except trees.JsonInputError:
        return None
    if not isinstance(summary, dict) or summary.get("id") != d.name or not isinstance(summary.get("created"), str):
        return None
    settings = summary.get("settings")
    numbers_ok = all(isinstance(summary.get(k), (int, float)) and not isinstance(summary.get(k), bool)
                     for k in ("steps", "tokens", "tokens_per_step"))
    if not (numbers_ok and isinstance(settings, dict) and isinstance(settings.get("prompt"), str)
            and isinstance(summary.get("finish") or "", str)
            and isinstance(settings.get("mode"), str) and isinstance(settings.get("tree") or [], list)):
        return None
    return summary
