"""Write benchmarks/prompts/thirdparty_{tune,test}.jsonl: function starts from third-party packages
(permissively licensed: BSD/MIT/Apache), code the demo model never saw (it trained on the CPython
standard library). Deterministic given the installed package versions (recorded in each line).

    python benchmarks/make_thirdparty_prompts.py --per-set 60
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import re
from pathlib import Path

PACKAGES = ["numpy", "networkx", "plotly", "jinja2", "pygments", "packaging", "httpx", "click", "attr", "markdown_it",
            "narwhals", "jsonschema", "pydantic", "rich", "fsspec", "dateutil", "idna", "anyio"]
DEF = re.compile(r"^(    )?def [a-z_][a-z0-9_]*\(.*$", re.M)


def starts(text: str, chars: int = 300) -> list[str]:
    """Function starts: from a `def` line through its docstring's opening, cut at a line end."""
    out = []
    for m in DEF.finditer(text):
        block = text[m.start(): m.start() + chars]
        cut = block.rfind("\n")
        if cut > 60 and '"""' in block[:cut]:
            out.append(block[: cut + 1])
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--per-set", type=int, default=60)
    p.add_argument("--out", default=str(Path(__file__).parent / "prompts"))
    a = p.parse_args()
    pool = []
    for pkg in PACKAGES:
        try:
            mod = __import__(pkg)
        except ImportError:
            continue
        root = Path(mod.__file__).parent
        dist = {"attr": "attrs", "dateutil": "python-dateutil", "markdown_it": "markdown-it-py"}.get(pkg, pkg)
        version = importlib.metadata.version(dist)
        for f in sorted(root.rglob("*.py")):
            if "test" in f.as_posix():
                continue
            try:
                text = f.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            for i, s in enumerate(starts(text)):
                key = hashlib.sha1(f"{pkg}/{f.relative_to(root)}:{i}".encode()).hexdigest()
                pool.append((key, {"prompt": s, "source": f"{dist} {version}: {f.relative_to(root)}"}))
    pool.sort()
    by_pkg: dict[str, list[dict]] = {}
    seen_files = set()
    for _, item in pool:  # at most one start per file, in hash order
        if item["source"] not in seen_files:
            seen_files.add(item["source"])
            by_pkg.setdefault(item["source"].split()[0], []).append(item)
    chosen = []
    while len(chosen) < 2 * a.per_set and any(by_pkg.values()):  # round-robin over packages: both sets get the same mix
        for pkg in sorted(by_pkg):
            if by_pkg[pkg] and len(chosen) < 2 * a.per_set:
                chosen.append(by_pkg[pkg].pop(0))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, items in (("tune", chosen[0::2]), ("test", chosen[1::2])):
        (out / f"thirdparty_{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in items))
        print(name, len(items), sorted({x["source"].split()[0] for x in items}))


if __name__ == "__main__":
    main()
