"""What the workbench keeps on disk under its data folder, written atomically:

  trees/NAME.json          saved trees (schema-1 JSON, mode 0644), in every tree dropdown
  runs/ID/trace.jsonl      the last MAX_RUNS decode runs: step traces (docs/trace-schema.md) ...
  runs/ID/settings.json    ... and the settings, text and summary of the run
  pools/NAME.jsonl         collected AR traces (Tune), the estimators' input
  .staging/                temp files before their rename; orphans from a killed process are
                           removed at start, and this folder is never served
"""

from __future__ import annotations

import json
import re
import shutil
import time
import uuid
from pathlib import Path

import trees

MAX_RUNS = 50
MAX_POOLS = 20


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
        self.staging = self.root / ".staging"
        for d in (self.trees_dir, self.runs_dir, self.pools_dir, self.staging):
            d.mkdir(parents=True, exist_ok=True)
        self.clean_orphans()

    def clean_orphans(self) -> int:
        """Remove temp files a killed process left (in staging, and beside files from older versions)."""
        n = 0
        for d in (self.staging, self.trees_dir, self.runs_dir, self.pools_dir):
            for p in d.rglob(".*.tmp"):
                p.unlink(missing_ok=True)
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
    def save_run(self, settings: dict, traces: list[dict], text: str) -> str:
        """Keep one finished (or stopped) run; the oldest beyond MAX_RUNS are removed. -> run id."""
        run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
        d = self.runs_dir / run_id
        d.mkdir(parents=True)
        # the trace schema's header (docs/trace-schema.md) names the rule `acceptance`; the settings say `accept`
        header = {"type": "header", "schema_version": 1, "acceptance": settings.get("accept"), **settings}
        lines = [json.dumps(header, ensure_ascii=False)] + [json.dumps(t, ensure_ascii=False) for t in traces]
        self._write(d / "trace.jsonl", "\n".join(lines) + "\n")
        tokens = sum(len(t["accepted_tokens"]) for t in traces)
        summary = {"id": run_id, "created": time.strftime("%Y-%m-%d %H:%M:%S"), "settings": settings, "text": text,
                   "steps": len(traces), "tokens": tokens, "tokens_per_step": round(tokens / max(len(traces), 1), 3)}
        self._write(d / "settings.json", json.dumps(summary, ensure_ascii=False, indent=1))
        for old in sorted(self.runs_dir.iterdir())[:-MAX_RUNS]:
            shutil.rmtree(old, ignore_errors=True)
        return run_id

    def list_runs(self) -> list[dict]:
        out = []
        for d in sorted(self.runs_dir.iterdir(), reverse=True):
            try:
                out.append(json.loads((d / "settings.json").read_text(encoding="utf-8")))
            except (OSError, ValueError):
                continue  # a run being written, or damaged: not listed
        return out

    def run_dir(self, run_id: str) -> Path:
        d = self.runs_dir / safe_name(run_id)
        if not (d / "trace.jsonl").exists():
            raise StoreError(f"no saved run {run_id!r}")
        return d

    def load_run(self, run_id: str) -> tuple[dict, list[dict]]:
        d = self.run_dir(run_id)
        summary = json.loads((d / "settings.json").read_text(encoding="utf-8"))
        steps = [obj for _, obj in trees.stats.iter_trace_lines(d / "trace.jsonl") if obj.get("type") != "header"]
        return summary, steps

    # -- trace pools -----------------------------------------------------------------------------
    def pool_names(self) -> list[str]:
        return sorted(p.stem for p in self.pools_dir.glob("*.jsonl") if not p.name.startswith("."))

    def pool_path(self, name: str) -> Path:
        return self.pools_dir / f"{safe_name(name)}.jsonl"

    def save_pool(self, name: str, lines: list[str]) -> Path:
        p = self._write(self.pool_path(name), "\n".join(lines) + "\n")
        pools = sorted(self.pools_dir.glob("*.jsonl"), key=lambda f: f.stat().st_mtime)
        for old in pools[:-MAX_POOLS]:
            old.unlink(missing_ok=True)
        return p
