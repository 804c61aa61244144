"""Tree files: the schema-1 JSON of docs/tree-format.md, bare lists, and other engines' formats.

Saving is atomic (temp file in the same folder, fsync, rename) so a crash mid-save leaves the
previous file whole, and it refuses to replace a different tree unless asked. Every file this
project reads or replaces goes through `open_for_reading` / `check_output_file` first: only
regular files are opened or replaced (a FIFO would block the reader; `--out /dev/null` must never
replace the device node).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import IO

from .tree import MAX_DEPTH, MAX_NODES, MAX_TOPK, TreeError, as_lists, depth, validate

SCHEMA_VERSION = 1
DEFAULT_TOPK = 10  # a tree's topk when its file does not say (Medusa's)
MAX_JSON_BYTES = 16 * 2**20  # tree, trace-line, latency and config files are far smaller


class JsonInputError(ValueError):
    """A file or JSON text that cannot be used: missing, not a regular file, unreadable, too large,
    not JSON, nested too deep."""


class OutputPathError(ValueError):
    """A path that cannot be written: a directory, FIFO, device or socket stands there."""


def parse_json(text: str, where: str, max_bytes: int = MAX_JSON_BYTES) -> object:
    """json.loads with the failures users cause turned into one-line JsonInputErrors naming `where`:
    size over max_bytes, syntax errors, and nesting deep enough to exhaust the parser's recursion."""
    if not isinstance(text, str):
        raise JsonInputError(f"{where}: expected JSON text, got {type(text).__name__}")
    if len(text) > max_bytes:
        raise JsonInputError(f"{where}: {len(text)} characters, more than the {max_bytes} allowed")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise JsonInputError(f"{where}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except RecursionError:
        raise JsonInputError(f"{where}: JSON nested too deeply to read") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise JsonInputError(f"{where}: a number with too many digits ({str(e).split(':')[0][:80]})") from None


def _kind(mode: int) -> str | None:
    """Why a file of this st_mode is refused, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    return "not a regular file (a FIFO, device or socket is refused)"


def open_for_reading(path: str | os.PathLike, binary: bool = False) -> IO:
    """Open a regular file for reading; anything else is a JsonInputError before a byte is read.
    The open is non-blocking (opening a FIFO that has no writer would wait forever) and the opened
    descriptor itself is checked, so a file swapped in after the first look is still refused."""
    p = FsPath(path)
    try:
        why = _kind(os.stat(p).st_mode)
        if why is None:
            fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            why = _kind(os.fstat(fd).st_mode)
            if why is not None:
                os.close(fd)
    except FileNotFoundError:
        raise JsonInputError(f"{p}: no such file") from None
    except OSError as e:
        raise JsonInputError(f"{p}: cannot read ({e.strerror or e})") from None
    if why is not None:
        raise JsonInputError(f"{p}: {why}")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb") if binary else os.fdopen(fd, encoding="utf-8")


def check_output_file(path: str | os.PathLike) -> FsPath:
    """A path a file may be written to or replaced at: nothing there yet, or a regular file (a
    symlink counts as what it points to). A directory, FIFO or device is refused before anything is
    opened or renamed over it."""
    p = FsPath(path)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        return p
    except OSError as e:
        raise OutputPathError(f"{p}: cannot write here ({e.strerror or e})") from None
    if stat.S_ISDIR(mode):
        raise OutputPathError(f"{p}: is a directory; give a file path")
    if not stat.S_ISREG(mode):
        raise OutputPathError(f"{p}: not a regular file (a FIFO, device or socket is never written to or replaced)")
    return p


def read_text_file(path: str | os.PathLike, max_bytes: int = MAX_JSON_BYTES) -> str:
    """A regular UTF-8 file of at most max_bytes (`open_for_reading`), read no further than that."""
    p = FsPath(path)
    with open_for_reading(p, binary=True) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(max_bytes + 1) if size <= max_bytes else b""
        if size > max_bytes or len(data) > max_bytes:
            raise JsonInputError(f"{p}: {max(size, len(data))} bytes, more than the {max_bytes} allowed")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise JsonInputError(f"{p}: not UTF-8 text") from None


def read_json_file(path: str | os.PathLike, max_bytes: int = MAX_JSON_BYTES) -> object:
    return parse_json(read_text_file(path, max_bytes), str(path), max_bytes)


@dataclass
class TreeFile:
    """A tree with its metadata, as stored on disk."""

    medusa_choices: list[list[int]]
    num_heads: int | None = None
    topk: int = DEFAULT_TOPK
    name: str = ""
    expected_accepted: float | None = None
    estimator: str = ""
    source: str = ""
    created: str = ""
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        out = {
            "schema_version": SCHEMA_VERSION,
            "medusa_choices": as_lists(self.medusa_choices),
            "num_heads": self.num_heads if self.num_heads is not None else depth(self.medusa_choices),
            "topk": self.topk,
            "name": self.name,
            "expected_accepted": self.expected_accepted,
            "estimator": self.estimator,
            "source": self.source,
            "created": self.created or _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        }
        out.update(self.extra)
        return out


def parse_tree(obj: object, *, where: str = "tree") -> TreeFile:
    """Accept a bare list of paths or a schema-1 object; validate the paths."""
    if isinstance(obj, list):
        return TreeFile(medusa_choices=as_lists(validate(obj)))
    if not isinstance(obj, dict):
        raise TreeError(f"{where}: expected a list of paths or an object with 'medusa_choices'")
    version = obj.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise TreeError(f"{where}: schema_version {version!r} is not supported (expected {SCHEMA_VERSION})")
    if "medusa_choices" not in obj:
        raise TreeError(f"{where}: missing 'medusa_choices'")
    topk = obj.get("topk", DEFAULT_TOPK)
    num_heads = obj.get("num_heads")
    if not isinstance(topk, int) or isinstance(topk, bool):
        raise TreeError(f"{where}: 'topk' must be an integer")
    if num_heads is not None and (not isinstance(num_heads, int) or isinstance(num_heads, bool)):
        raise TreeError(f"{where}: 'num_heads' must be an integer")
    paths = validate(obj["medusa_choices"], topk=topk, num_heads=num_heads)
    known = {"schema_version", "medusa_choices", "num_heads", "topk", "name", "expected_accepted",
             "estimator", "source", "created"}
    return TreeFile(
        medusa_choices=as_lists(paths),
        num_heads=num_heads,
        topk=topk,
        name=str(obj.get("name", "")),
        expected_accepted=obj.get("expected_accepted"),
        estimator=str(obj.get("estimator", "")),
        source=str(obj.get("source", "")),
        created=str(obj.get("created", "")),
        extra={k: v for k, v in obj.items() if k not in known},
    )


def load_tree(path: str | os.PathLike) -> TreeFile:
    """Read a tree file; a missing, corrupt or invalid file raises TreeError naming the file."""
    p = FsPath(path)
    try:
        obj = read_json_file(p)
    except JsonInputError as e:
        raise TreeError(str(e)) from None
    try:
        return parse_tree(obj, where=str(p))
    except TreeError as e:
        msg = str(e)
        raise TreeError(msg if msg.startswith(str(p)) else f"{p}: {msg}") from None


def write_atomic(path: str | os.PathLike, data: str, tmp_dir: str | os.PathLike | None = None, mode: int = 0o644) -> FsPath:
    """Write text so that a crash leaves either the old file or the new one, never a torn one: a temp
    file (in tmp_dir, on the same filesystem, else beside the target), fsync, chmod, rename."""
    p = check_output_file(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    where = FsPath(tmp_dir) if tmp_dir is not None else p.parent
    where.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=where, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # mkstemp makes 0600; saved work is meant to be read
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return p


def save_tree(tree: TreeFile | Sequence[Sequence[int]], path: str | os.PathLike, *, overwrite: bool = False,
              tmp_dir: str | os.PathLike | None = None) -> FsPath:
    """Write atomically (`write_atomic`). An existing file holding a different tree is kept unless
    overwrite=True."""
    tf = tree if isinstance(tree, TreeFile) else TreeFile(medusa_choices=as_lists(validate(tree)))
    validate(tf.medusa_choices, topk=tf.topk, num_heads=tf.num_heads)
    p = FsPath(path)
    if p.exists() and not overwrite:
        try:
            same = load_tree(p).medusa_choices == as_lists(validate(tf.medusa_choices, topk=tf.topk))
        except TreeError:
            same = False
        if not same:
            raise FileExistsError(f"{p}: a different tree is already saved there (pass overwrite=True)")
    return write_atomic(p, json.dumps(tf.to_json(), indent=1) + "\n", tmp_dir)


def to_trtllm(choices: Sequence[Sequence[int]]) -> str:
    """TensorRT-LLM takes `medusa_choices` as a list of lists (its `--medusa_choices` string). Exports
    check the tree's shape only: its ranks were checked against its own topk when it was read."""
    return json.dumps(as_lists(validate(choices, topk=MAX_TOPK))).replace(" ", "")


def to_vllm(choices: Sequence[Sequence[int]]) -> str:
    """vLLM's `speculative_token_tree`: a Python-literal list of tuples, breadth-first."""
    return "[" + ", ".join("(" + ", ".join(map(str, p)) + ("," if len(p) == 1 else "") + ")"
                           for p in validate(choices, topk=MAX_TOPK)) + "]"


TRTLLM_MAX_DRAFT_LEN = 63  # the max_draft_len TensorRT-LLM's Medusa examples build engines with


def export_warnings(choices: Sequence[Sequence[int]], target: str) -> list[str]:
    """What of this tree will not survive in `target`'s engine (docs/tree-format.md, "Exports"); the
    export still happens, these are warnings.

    >>> export_warnings([[0], [2]], "trtllm")[0][:60]
    "depth-1 ranks [0, 2] are not 0..1: TensorRT-LLM's older Pyth"
    """
    paths = validate(choices, topk=MAX_TOPK)
    out = []
    if target == "trtllm":
        first = sorted(p[0] for p in paths if len(p) == 1)
        if first != list(range(len(first))):
            out.append(f"depth-1 ranks {first} are not 0..{len(first) - 1}: TensorRT-LLM's older Python-session "
                       "Medusa parser corrupts such trees")
        if len(paths) > TRTLLM_MAX_DRAFT_LEN:
            out.append(f"{len(paths)} nodes: an engine built with max_draft_len {TRTLLM_MAX_DRAFT_LEN} (TensorRT-LLM's "
                       f"Medusa examples) takes at most {TRTLLM_MAX_DRAFT_LEN}; build with --max_draft_len {len(paths)}")
    elif target == "vllm":
        chain = [tuple([0] * d) for d in range(1, depth(paths) + 1)]
        if paths != chain:
            out.append(f"vLLM's Medusa proposer reads no tree: it drafts each head's top-1, a chain of num_heads "
                       f"tokens, whatever these {len(paths)} nodes say; speculative_token_tree is read by its EAGLE "
                       f"tree proposer (with num_speculative_tokens {len(paths)})")
    return out


def from_counts(counts: Sequence[int]) -> list[list[int]]:
    """Medusa 0.1's tree format: a count per level, the root's first, every product path kept.
    `[1, 7, 6]` is the root, head 0's top 7 under it and head 1's top 6 under each of those:
    7 + 42 = 49 nodes of depth 2 (as Medusa 0.1 builds it; the root is the base model's own token,
    so its count is always 1). The node count (a sum of products) is checked before a path is built."""
    if not counts or len(counts) > MAX_DEPTH + 1 or any(isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= MAX_TOPK
                                                        for c in counts):
        raise TreeError(f"per-level counts {list(counts)[:MAX_DEPTH + 2]!r}: need 2..{MAX_DEPTH + 1} positive integers, "
                        f"each in [1, {MAX_TOPK}]")
    if counts[0] != 1:
        raise TreeError(f"per-level counts {list(counts)!r}: the first count is the root's (the base model's "
                        "own token) and must be 1")
    if len(counts) == 1:
        raise TreeError("per-level counts [1]: only the root; give at least one head's count")
    nodes = level = 1
    for c in counts[1:]:
        level *= c
        nodes += level
        if nodes - 1 > MAX_NODES:
            raise TreeError(f"per-level counts {list(counts)!r}: the full tree has more than {MAX_NODES} nodes "
                            "(the most one step verifies)")
    level: list[tuple[int, ...]] = [()]
    out: list[tuple[int, ...]] = []
    for c in counts[1:]:
        level = [p + (r,) for p in level for r in range(c)]
        out.extend(level)
    return as_lists(validate(out, topk=max(counts)))
