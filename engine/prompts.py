"""Held-out prompts for the demo model: slices of standard-library files the model never trained on."""

from __future__ import annotations

from .corpus import is_heldout, stdlib_files


def heldout_prompts(n: int = 16, chars: int = 300) -> list[str]:
    """Up to n prompts, one per held-out file: `chars` characters from a third of the way in,
    cut at line boundaries so each prompt ends with a newline, as code continues."""
    out = []
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
