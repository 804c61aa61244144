"""The README's code map lists every module with its layer, and the imports obey the layers:
tools -> runtime only (the runtime never imports a tool), trees/ imports neither engine/ nor
workbench/, workbench/ never imports torch or triton, and engine/ never imports workbench/. The
docs' references to code (`file.py::Name`, the app's flags) name what the code has."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "trees", "workbench")
ROW = re.compile(r"^\| `([\w/.]+\.py)` \| (runtime|tool|trees|workbench|app) \|")


def code_map(readme: str) -> dict[str, str]:
    section = readme.split("## Code map", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): m.group(2) for line in section.splitlines() if (m := ROW.match(line))}


def module_name(path: str) -> str:
    parts = path[:-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> list[str]:
    files = [p.relative_to(ROOT).as_posix() for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    return sorted(files + ["app.py"])


def read(path: str) -> str:
    return (ROOT / path).read_text()


def imports_of(source: str, path: str, known: set[str]) -> set[str]:
    """Every module `path` imports (top level or inside functions), relative imports resolved; a
    `from pkg import name` counts as importing pkg.name when that is a module of ours."""
    tree = ast.parse(source)
    name = module_name(path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            out.add(target)
            out |= {f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known}
    return out


def violations(layers: dict[str, str], source=read) -> list[str]:
    by_module = {module_name(p): layer for p, layer in layers.items()}
    known = set(by_module)
    bad = []
    for path, layer in layers.items():
        for imp in sorted(imports_of(source(path), path, known)):
            top = imp.split(".")[0]
            target = by_module.get(imp)
            if layer == "runtime" and (target in ("tool", "workbench", "app") or top == "workbench"):
                bad.append(f"{path} (runtime) imports {imp} ({target or top})")
            if layer == "tool" and top == "workbench":
                bad.append(f"{path} (tool) imports {imp}")
            if layer == "trees" and top in ("engine", "workbench"):
                bad.append(f"{path} (trees) imports {imp}")
            if layer == "workbench" and (top in ("torch", "triton") or target == "tool"):
                bad.append(f"{path} (workbench) imports {imp}")
    return bad


def test_code_map_lists_every_module_with_its_layer():
    layers = code_map((ROOT / "README.md").read_text())
    assert sorted(layers) == modules()
    for path, layer in layers.items():
        top = path.split("/")[0]
        assert layer in {"engine": ("runtime", "tool")}.get(top, (top if top in PACKAGES else "app",)), path


def test_imports_run_one_way():
    assert violations(code_map((ROOT / "README.md").read_text())) == []


@pytest.mark.parametrize("path,layer,line", [
    ("engine/decode.py", "runtime", "from .cli import Parser"),
    ("engine/model.py", "runtime", "from engine.bench import oracle"),
    ("trees/tree.py", "trees", "import engine"),
    ("workbench/figures.py", "workbench", "import torch"),
    ("workbench/core.py", "workbench", "from engine.train import heads"),
])
def test_a_wrong_way_import_is_caught(path, layer, line):
    """The checker itself: the module with one wrong-way import added (inside a function, where it
    is easiest to hide) is reported."""
    layers = code_map(read("README.md"))
    assert layers[path] == layer and violations(layers) == []
    planted = read(path) + f"\n\ndef _planted():\n    {line}\n"
    got = violations(layers, lambda p: planted if p == path else read(p))
    assert got and all(g.startswith(path) for g in got), got


def defined_names(source: str) -> set[str]:
    tree = ast.parse(source)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def test_every_code_reference_in_the_docs_names_something_there():
    """`path.py::Name` in the README and docs/ points at a file that defines Name."""
    docs = ["README.md"] + sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))
    refs = [(doc, path, name) for doc in docs for path, name in re.findall(r"`([\w/.]+\.py)::(\w+)`", read(doc))]
    assert len(refs) >= 5
    missing = [f"{doc}: {path}::{name}" for doc, path, name in refs
               if not (ROOT / path).exists() or name not in defined_names(read(path))]
    assert missing == []


def test_the_app_doc_names_the_apps_flags_and_backends():
    """docs/app.md's command line lists real flags of `python app.py`, with every attention backend."""
    import app
    from engine.attention import BACKENDS

    usage = re.search(r"`python app\.py ([^`]+)`", read("docs/app.md")).group(1)
    flags = {a.option_strings[-1]: a for a in app.parser()._actions if a.option_strings}
    named = re.findall(r"\[(--[\w-]+)(?: ([^\]]+))?\]", usage)
    assert named and all(flag in flags for flag, _ in named), named
    backend = dict(named)["--backend"]
    assert backend.split("|") == list(BACKENDS) == list(flags["--backend"].choices)
