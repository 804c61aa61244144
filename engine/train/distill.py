"""Self-distillation: the base model's own greedy answers, the data Medusa heads should learn from.

Heads must predict what the model will write at decode time, so they train best on the model's own
output (Medusa-2's advice). Prompts are a prompt file's turns, wrapped in the model's chat template
when it has one (an instruct model answers inside its template), or random windows of a token
stream (a base model continues text). Answers come from the engine's batched greedy decoding
(`Engine.greedy_continuations`: on CUDA, bf16 with CUDA graphs, tokens read once per batch).

The batch decodes to `max_new_tokens` without stopping at EOS, and each answer is cut after its
first EOS here. A batch that kept its size replays one CUDA graph throughout; letting finished
requests leave would capture a graph for every batch size it passes through. The slots decoded
after an EOS are the price (`wasted_slots` in the report; 37 % of them in SmolLM2's answers to
ShareGPT turns at 512 tokens).

Output: a folder of shards (`shard-00000.npz`: flat `tokens`, sequence `offsets`, each sequence's
`answer_start`) and `progress.json`; a run resumes from the prompt after the last shard written.
`data.read_sequences` reads the folder back for training (engine/train/heads.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

import trees

from .data import Sequences, write_shard

SHARD_TOKENS = 1_500_000  # tokens per shard: a few MB, so shards travel as files of their own


def cut_at_eos(answer: list[int], eos: set[int]) -> tuple[list[int], bool]:
    """An answer up to and including its first EOS (the heads learn to predict the end too)."""
    for i, t in enumerate(answer):
        if t in eos:
            return answer[: i + 1], True
    return answer, False


def self_distill(eng, prompts: list[list[int]], out: str | Path, max_new_tokens: int, batch: int = 256,
                 tokens: int | None = None, log=print) -> dict:
    """Decode `prompts` (token ids) greedily in batches of `batch` and write their answers to `out`,
    stopping early once `tokens` answer tokens are written. Resumes from `out/progress.json`."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    progress_file = folder / "progress.json"
    progress = {"prompts_done": 0, "shards": 0, "answer_tokens": 0, "sequences": 0, "ended_at_eos": 0,
                "wasted_slots": 0, "seconds": 0.0}
    if progress_file.exists():
        progress = trees.read_json_file(progress_file)
        log(f"self-distill: resuming after {progress['prompts_done']} prompts ({progress['answer_tokens']} answer tokens)")
    pending_seqs: list[list[int]] = []
    pending_starts: list[int] = []
    t0 = time.time() - progress["seconds"]
    i = progress["prompts_done"]

    def flush() -> None:
        if pending_seqs:
            write_shard(folder, progress["shards"], Sequences.from_list(pending_seqs, pending_starts))
            progress["shards"] += 1
            pending_seqs.clear()
            pending_starts.clear()
        progress["prompts_done"], progress["seconds"] = i, round(time.time() - t0, 1)
        trees.write_atomic(progress_file, json.dumps(progress, indent=1))

    while i < len(prompts) and (tokens is None or progress["answer_tokens"] < tokens):
        wave = prompts[i : i + batch]
        for ids, decoded in zip(wave, eng.greedy_continuations(wave, max_new_tokens)):
            answer, ended = cut_at_eos(decoded, eng.eos_ids)
            pending_seqs.append(ids + answer)
            pending_starts.append(len(ids))
            progress["answer_tokens"] += len(answer)
            progress["ended_at_eos"] += ended
            progress["wasted_slots"] += len(decoded) - len(answer)
            progress["sequences"] += 1
        i += len(wave)
        elapsed = time.time() - t0
        rate = progress["answer_tokens"] / max(elapsed, 1e-9)
        eta = f", ETA {(tokens - progress['answer_tokens']) / rate:.0f} s" if tokens and rate > 0 else ""
        log(f"self-distill: {i}/{len(prompts)} prompts, {progress['answer_tokens']} answer tokens "
            f"({rate:.0f}/s, {progress['ended_at_eos']} ended at EOS){eta}")
        if sum(map(len, pending_seqs)) >= SHARD_TOKENS:
            flush()
    flush()
    return {**progress, "out": str(folder)}


def window_prompts(stream: np.ndarray, n: int, length: int, seed: int) -> list[list[int]]:
    """n random `length`-token windows of a token stream: prompts for a base model that continues text."""
    if len(stream) <= length:
        raise ValueError(f"{len(stream)} tokens: too few for prompts of {length}")
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(stream) - length, size=n)
    return [stream[s : s + length].tolist() for s in starts]


def chat_prompts(eng, texts: list[str], max_prompt_tokens: int, chat: bool | None = None) -> tuple[list[list[int]], int]:
    """Prompt texts as token ids (in the chat template when `chat`, default: when the model has one);
    those longer than max_prompt_tokens are left out. -> (ids, how many were left out)."""
    use_chat = eng.has_chat_template if chat is None else chat
    ids = [eng.encode(t, chat=use_chat) for t in texts]
    kept = [i for i in ids if len(i) <= max_prompt_tokens]
    return kept, len(ids) - len(kept)
