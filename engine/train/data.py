"""Training data: token files or text, and random batches of them (one batcher for both trainers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

import trees

from ..loading import load_tokenizer


def read_training_tokens(data: str | Path, model_dir: Path, vocab_size: int) -> np.ndarray:
    """A uint16/uint32 `.bin`/`.npy` token file, or text (a file, or a folder of .txt/.py/.md files).
    Only regular files are read (a FIFO would block), and every id must be below vocab_size (an id
    past the embedding table is a crash deep inside the model, not an error naming the file)."""
    p = Path(data)
    files = sorted(f for f in p.rglob("*") if f.suffix in (".txt", ".py", ".md")) if p.is_dir() else [p]
    if not files:
        raise ValueError(f"{p}: no .txt/.py/.md files to train on")
    if p.suffix in (".npy", ".bin"):
        with _open(p) as f:
            tokens = np.load(f) if p.suffix == ".npy" else np.frombuffer(f.read(), dtype=np.uint16)
        tokens = np.asarray(tokens)
        if tokens.dtype.kind not in "iu":
            raise ValueError(f"{p}: token ids must be integers, got {tokens.dtype}")
        tokens = tokens.astype(np.int64)
    else:
        tok = load_tokenizer(model_dir)
        if tok is None:
            raise ValueError(f"{model_dir}: text data needs a tokenizer; pass a token file (.bin/.npy)")
        ids: list[int] = []
        for f in files:
            with _open(f) as fh:
                ids.extend(tok.encode(fh.read().decode("utf-8", errors="replace")))
            if tok.eos_token_id is not None:
                ids.append(tok.eos_token_id)
        tokens = np.asarray(ids, dtype=np.int64)
    bad = tokens[(tokens < 0) | (tokens >= vocab_size)]
    if bad.size:
        raise ValueError(f"{p}: token id {int(bad[0])} is outside the model's vocabulary [0, {vocab_size})")
    return tokens


def _open(path: Path):
    try:
        return trees.open_for_reading(path, binary=True)
    except trees.JsonInputError as e:
        raise ValueError(str(e)) from None


def get_batch(tokens: np.ndarray, batch: int, seq: int, device, rng):
    """Random windows of a flat token stream, or random rows of a [N, seq+1] array of sequences."""
    if tokens.ndim == 2:
        x = torch.from_numpy(tokens[rng.integers(0, len(tokens), size=batch)]).to(device)
    else:
        starts = rng.integers(0, len(tokens) - seq - 1, size=batch)
        x = torch.from_numpy(np.stack([tokens[s : s + seq + 1] for s in starts]).astype(np.int64)).to(device)
    return x[:, :-1], x[:, 1:]
