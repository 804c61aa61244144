"""Training data: token files or text, and random batches of them (one batcher for both trainers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..loading import load_tokenizer


def read_training_tokens(data: str | Path, model_dir: Path) -> np.ndarray:
    """A uint16/uint32 `.bin`/`.npy` token file, or text (a file, or a folder of .txt/.py/.md files)."""
    p = Path(data)
    if p.suffix == ".npy":
        return np.load(p).astype(np.int64)
    if p.suffix == ".bin":
        return np.fromfile(p, dtype=np.uint16).astype(np.int64)
    files = sorted(f for f in p.rglob("*") if f.suffix in (".txt", ".py", ".md")) if p.is_dir() else [p]
    if not files:
        raise ValueError(f"{p}: no .txt/.py/.md files to train on")
    tok = load_tokenizer(model_dir)
    if tok is None:
        raise ValueError(f"{model_dir}: text data needs a tokenizer; pass a token file (.bin/.npy)")
    ids: list[int] = []
    for f in files:
        ids.extend(tok.encode(f.read_text(encoding="utf-8", errors="replace")))
        if tok.eos_token_id is not None:
            ids.append(tok.eos_token_id)
    return np.asarray(ids, dtype=np.int64)


def get_batch(tokens: np.ndarray, batch: int, seq: int, device, rng):
    """Random windows of a flat token stream, or random rows of a [N, seq+1] array of sequences."""
    if tokens.ndim == 2:
        x = torch.from_numpy(tokens[rng.integers(0, len(tokens), size=batch)]).to(device)
    else:
        starts = rng.integers(0, len(tokens) - seq - 1, size=batch)
        x = torch.from_numpy(np.stack([tokens[s : s + seq + 1] for s in starts]).astype(np.int64)).to(device)
    return x[:, :-1], x[:, 1:]
