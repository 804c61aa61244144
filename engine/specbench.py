"""`python -m engine spec-bench`: answer a Spec-Bench / MT-Bench question file in Spec-Bench's answer
layout, so our runs drop into its `evaluation/speed.py` next to other methods' answers.

One JSON line per question: question_id, category, answer_id, model_id, tstamp, and choices[0] with
turns (the answer texts), decoding_steps, new_tokens and wall_time per turn, and accept_lengths
(tokens committed at every step of every turn). Multi-turn questions continue the conversation:
with --chat through the tokenizer's chat template, otherwise as plain text (turn, answer, turn...).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from .generation import GenerationConfig
from .prompts import read_prompts


def conversation(engine, turns: list[str], answers: list[str], chat: bool) -> list[int]:
    """Token ids of the conversation so far, ending where the model's next answer begins."""
    if chat:
        messages = []
        for i, t in enumerate(turns):
            messages.append({"role": "user", "content": t})
            if i < len(answers):
                messages.append({"role": "assistant", "content": answers[i]})
        ids = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    text = ""
    for i, t in enumerate(turns):
        text += t + "\n\n" + (answers[i] + "\n\n" if i < len(answers) else "")
    return engine.encode(text)


def write_answers(engine, question_file: str, answer_file: str, cfg: GenerationConfig, model_id: str | None = None,
                  begin: int | None = None, end: int | None = None) -> dict:
    """Answer questions[begin:end] (appending to answer_file, one line per question, flushed); -> a summary."""
    questions = read_prompts(question_file)[begin:end]
    model_id = model_id or Path(str(engine.name)).name
    steps = tokens = 0
    wall = 0.0
    with open(answer_file, "a", encoding="utf-8") as out:
        for q in questions:
            answers, choice = [], {"index": 0, "turns": [], "decoding_steps": [], "new_tokens": [], "wall_time": [],
                                   "accept_lengths": []}
            for i in range(len(q.turns)):
                ids = conversation(engine, q.turns[: i + 1], answers, cfg.chat)
                t0 = time.perf_counter()
                events = list(engine.stream(ids, config=cfg.replace(chat=False)))
                elapsed = time.perf_counter() - t0
                text = "".join(e.text for e in events).strip()
                answers.append(text)
                choice["turns"].append(text)
                choice["decoding_steps"].append(len(events))
                choice["new_tokens"].append(sum(len(e.tokens) for e in events))
                choice["wall_time"].append(elapsed)
                choice["accept_lengths"].extend(len(e.tokens) for e in events)
            steps += sum(choice["decoding_steps"])
            tokens += sum(choice["new_tokens"])
            wall += sum(choice["wall_time"])
            out.write(json.dumps({"question_id": q.id, "category": q.category, "answer_id": uuid.uuid4().hex[:22],
                                  "model_id": model_id, "choices": [choice], "tstamp": time.time()},
                                 ensure_ascii=False) + "\n")
            out.flush()
    return {"answer_file": answer_file, "questions": len(questions), "steps": steps, "new_tokens": tokens,
            "mean_accepted": round(tokens / max(steps, 1), 4), "tokens_per_s": round(tokens / wall, 2) if wall else None,
            "mode": cfg.mode, "tree": cfg.tree}
