"""Prompt sets: the demo model's held-out prompts, and users' own prompt files.

Held-out prompts are slices of standard-library files the demo model never trained on (a file is
held out when sha1 of its relative path is 0 mod 40, ~2.5%, so the split is by file and stable
across machines with the same Python). Prompt files (`--prompts-file`, the Tune and Compare tabs):
  *.jsonl  one JSON object per line with `prompt` (a string) or `turns` (a list of strings: MT-Bench
           and Spec-Bench question files); `question_id` (or `id`) is kept when present (also *.json)
  *.txt    plain text, prompts separated by lines holding only `---` (also *.md; any other name is
           read as JSON lines when its text starts with '{')
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import trees

HELDOUT_MOD = 40
SEPARATOR = "---"
MAX_PROMPTS = 100_000
MAX_PROMPT_FILE_BYTES = 64 * 2**20


def stdlib_files(root: Path | None = None) -> list[tuple[str, str]]:
    """(relative path, text) of every UTF-8 `.py` file of the standard library (site-packages excluded)."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if "site-packages" in rel or "dist-packages" in rel:
            continue
        try:
            out.append((rel, p.read_bytes().decode("utf-8")))
        except (UnicodeDecodeError, OSError):
            continue  # not valid UTF-8 (a few test fixtures): skipped by design
    return out


def is_heldout(rel: str) -> bool:
    return int(hashlib.sha1(rel.encode()).hexdigest(), 16) % HELDOUT_MOD == 0


def heldout_prompts(n: int = 16, chars: int = 300) -> list[str]:
    """Up to n prompts, one per held-out file: `chars` characters from a third of the way in,
    cut at line boundaries so each prompt ends with a newline, as code continues."""
    out: list[str] = []
    if n < 1:
        return out
    for rel, text in stdlib_files():
        if not is_heldout(rel) or len(text) < 3 * chars:
            continue
        start = text.find("\n", len(text) // 3) + 1
        end = text.rfind("\n", start, start + chars) + 1
        if end > start:
            out.append(text[start:end])
        if len(out) == n:
            break
    return out


@dataclass
class Prompt:
    text: str  # the first turn: what single-turn runs decode
    turns: list[str] = field(default_factory=list)
    id: object = None  # question_id (or id) from a JSONL file, else the 0-based index
    category: str | None = None  # a question file's category (Spec-Bench, MT-Bench)


class PromptFileError(ValueError):
    """A prompt file that cannot be used; the message names the file and line."""


def parse_prompts(text: str, where: str = "prompts", jsonl: bool | None = None) -> list[Prompt]:
    """Prompts from file contents (see the module docstring); jsonl=None decides from the text."""
    if jsonl is None:
        jsonl = text.lstrip().startswith("{")
    out: list[Prompt] = []
    if jsonl:
        # JSON Lines ends a record at "\n" only: str.splitlines would also split at U+2028 and other
        # Unicode line breaks, which JSON strings may hold unescaped (ShareGPT's do)
        for n, line in enumerate(text.split("\n"), 1):
            if not line.strip():
                continue
            try:
                obj = trees.parse_json(line, f"{where}:{n}")
            except trees.JsonInputError as e:
                raise PromptFileError(str(e)) from None
            turns = obj.get("turns") if isinstance(obj, dict) else None
            prompt = obj.get("prompt") if isinstance(obj, dict) else None
            if isinstance(prompt, str) and prompt.strip():
                turns = [prompt]
            if not (isinstance(turns, list) and turns and all(isinstance(t, str) and t.strip() for t in turns)):
                raise PromptFileError(f"{where}:{n}: expected an object with 'prompt' (text) or 'turns' (a list of texts)")
            out.append(Prompt(turns[0], list(turns), obj.get("question_id", obj.get("id", len(out))), obj.get("category")))
            if len(out) > MAX_PROMPTS:
                raise PromptFileError(f"{where}: more than {MAX_PROMPTS} prompts")
    else:
        block: list[str] = []
        for line in text.splitlines(keepends=True) + [SEPARATOR]:
            if line.strip() == SEPARATOR:
                body = "".join(block)
                if body.strip():
                    out.append(Prompt(body, [body], len(out)))
                block = []
            else:
                block.append(line)
            if len(out) > MAX_PROMPTS:
                raise PromptFileError(f"{where}: more than {MAX_PROMPTS} prompts")
    if not out:
        raise PromptFileError(f"{where}: no prompts found")
    return out


def read_prompts(path: str | os.PathLike) -> list[Prompt]:
    try:
        text = trees.read_text_file(path, MAX_PROMPT_FILE_BYTES)
    except trees.JsonInputError as e:
        raise PromptFileError(str(e)) from None
    return parse_prompts(text, str(path), jsonl=jsonl_by_name(path))


def jsonl_by_name(path: str | os.PathLike) -> bool | None:
    """What a prompt file's name says it holds: JSON lines (.jsonl, .json), text (.txt, .md), or
    None (decided from the text). A .txt file is text even when its first prompt starts with '{'."""
    suffix = Path(path).suffix.lower()
    return True if suffix in (".jsonl", ".json") else False if suffix in (".txt", ".md") else None


def prompt_set(prompts_file: str | None, count: int | None, offset: int | None = None, default: int = 12,
               default_offset: int = 0) -> list[Prompt]:
    """A command's prompts: the file's (all of them unless `count` caps them, after `offset`, default
    none), else `count` (or `default`) bundled held-out prompts after `offset` (default
    `default_offset`: bench skips the bundled prompts that tuning uses, never a file's own)."""
    if count is None:
        count = 0 if prompts_file else default
    if offset is None:
        offset = 0 if prompts_file else default_offset
    if isinstance(count, bool) or not isinstance(count, int) or count < 0 or offset < 0:
        raise PromptFileError(f"--prompts must be >= 0 and --offset >= 0, got {count} and {offset}")
    if prompts_file:
        found = read_prompts(prompts_file)[offset:]
        return found[:count] if count else found
    if count == 0:
        raise PromptFileError("--prompts must be at least 1 without --prompts-file")
    texts = heldout_prompts(offset + count)[offset:]
    if not texts:
        raise PromptFileError(f"no held-out prompts past offset {offset}")
    return [Prompt(t, [t], offset + i) for i, t in enumerate(texts)]
