"""The fetched benchmark prompt sets Tune and Compare offer beside the bundled held-out prompts.

MT-Bench (the benchmark the Medusa paper, EAGLE and Spec-Bench report on) and ShareGPT's held-out
human turns (the distribution Medusa's heads were trained on) come from `python -m engine fetch`; they
live in the cache's data folder, never in the repository, so a set that is not fetched yet is a
one-line message naming the command that fetches it.
"""

from __future__ import annotations

from pathlib import Path

from engine.loading import data_dir
from engine.prompts import Prompt, read_prompts

from .session import UserError

# choice -> (file in the cache's data folder, the fetch target that writes it)
NAMED_SETS = {"mt-bench": ("mtbench.jsonl", "mtbench"), "sharegpt": ("sharegpt_heldout.jsonl", "sharegpt")}


def named_set_path(name: str) -> Path:
    file, _ = NAMED_SETS[name]
    return data_dir() / file


def named_prompt_set(name: str) -> list[Prompt]:
    """The prompts of a fetched set (MT-Bench: each question's first turn); UserError when not fetched."""
    if name not in NAMED_SETS:
        raise UserError(f"unknown prompt set {name!r}; choose one of {', '.join(NAMED_SETS)}")
    path = named_set_path(name)
    if not path.is_file():
        raise UserError(f"the {name} prompts are not here yet ({path}): run `python -m engine fetch "
                        f"{NAMED_SETS[name][1]}` once")
    return read_prompts(path)
