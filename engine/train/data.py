"""Training data: token files or text (random windows for the base trainer) and `Sequences`, the
heads' data: token sequences with the position where each one's model-written part begins (a
self-distillation folder, or plain text cut into windows)."""

from __future__ import annotations

from dataclasses import dataclass
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
    check_vocabulary(tokens, vocab_size, str(p))
    return tokens


def check_vocabulary(tokens: np.ndarray, vocab_size: int, where: str) -> None:
    """Refuse an id outside [0, vocab_size): past the embedding table it is a crash deep inside the
    model (or a silently wrong row on some devices), not an error naming the file."""
    bad = tokens[(tokens < 0) | (tokens >= vocab_size)]
    if bad.size:
        raise ValueError(f"{where}: token id {int(bad[0])} is outside the model's vocabulary [0, {vocab_size})")


def _open(path: Path):
    try:
        return trees.open_for_reading(path, binary=True)
    except trees.JsonInputError as e:
        raise ValueError(str(e)) from None


def get_batch(tokens: np.ndarray, batch: int, seq: int, device, rng):
    """Random windows of a flat token stream -> (inputs, next-token targets), each [batch, seq]."""
    starts = rng.integers(0, len(tokens) - seq - 1, size=batch)
    x = torch.from_numpy(np.stack([tokens[s : s + seq + 1] for s in starts]).astype(np.int64)).to(device)
    return x[:, :-1], x[:, 1:]


@dataclass
class Sequences:
    """Token sequences and where each one's model-written part begins (0: all of it counts)."""

    tokens: np.ndarray  # flat int64
    offsets: np.ndarray  # [n + 1]
    answer_start: np.ndarray  # [n], relative to each sequence's start

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def get(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    def answer_tokens(self) -> int:
        return int((self.lengths() - self.answer_start).sum())

    def first(self, answer_tokens: int) -> Sequences:
        """The leading sequences that hold (at least) this many model-written tokens: smaller data sets
        of one distillation run, for a scaling curve."""
        written = np.cumsum(self.lengths() - self.answer_start)
        n = int(np.searchsorted(written, answer_tokens)) + 1
        return self.subset(np.arange(min(n, len(self))))

    def split(self, every: int) -> tuple[Sequences, Sequences]:
        """(the rest, every `every`-th sequence): a held-out part for data without one."""
        held = np.arange(len(self)) % every == every - 1
        return self.subset(np.flatnonzero(~held)), self.subset(np.flatnonzero(held))

    def subset(self, idx: np.ndarray) -> Sequences:
        parts = [self.get(int(i)) for i in idx]
        lens = np.array([len(p) for p in parts], dtype=np.int64)
        return Sequences(np.concatenate(parts) if parts else np.zeros(0, np.int64),
                         np.concatenate(([0], np.cumsum(lens))), self.answer_start[idx])

    @classmethod
    def from_list(cls, seqs: list[list[int]], starts: list[int]) -> Sequences:
        lens = np.array([len(s) for s in seqs], dtype=np.int64)
        flat = np.fromiter((t for s in seqs for t in s), dtype=np.int64, count=int(lens.sum()))
        return cls(flat, np.concatenate(([0], np.cumsum(lens))), np.array(starts, dtype=np.int64))

    @classmethod
    def windows(cls, stream: np.ndarray, length: int) -> Sequences:
        """A flat token stream cut into sequences of `length` tokens (one sequence when it is shorter),
        every position model-written."""
        length = min(length, len(stream))
        n = len(stream) // length if length else 0
        return cls(stream[: n * length].astype(np.int64), np.arange(n + 1, dtype=np.int64) * length,
                   np.zeros(n, dtype=np.int64))


def write_shard(folder: Path, index: int, seqs: Sequences) -> Path:
    """One shard of a self-distillation folder, written under a temporary name and renamed."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"shard-{index:05d}.npz"
    tmp = folder / f".shard-{index:05d}.tmp.npz"
    dtype = np.uint16 if seqs.tokens.size == 0 or seqs.tokens.max() < 2**16 else np.uint32
    np.savez_compressed(tmp, tokens=seqs.tokens.astype(dtype), offsets=seqs.offsets, answer_start=seqs.answer_start)
    tmp.replace(path)
    return path


def read_distilled(folder: str | Path) -> Sequences:
    """Every shard of a self-distillation folder, in order (regular files only: a FIFO would block)."""
    shards = sorted(Path(folder).glob("shard-*.npz"))
    if not shards:
        raise ValueError(f"{folder}: no shard-*.npz files (not a self-distillation folder)")
    tokens, offsets, starts, base = [], [np.zeros(1, np.int64)], [], 0
    for f in shards:
        with _open(f) as fh, np.load(fh) as z:
            tokens.append(z["tokens"].astype(np.int64))
            offsets.append(z["offsets"][1:].astype(np.int64) + base)
            starts.append(z["answer_start"].astype(np.int64))
            base += len(tokens[-1])
    return Sequences(np.concatenate(tokens), np.concatenate(offsets), np.concatenate(starts))


def read_sequences(data: str | Path, model_dir: Path, window: int, vocab_size: int) -> Sequences:
    """A self-distillation folder (shard-*.npz) as it is, or a token/text file cut into windows of
    `window` tokens (every position model-written: plain text has no prompt part); either way every
    id is checked against vocab_size."""
    p = Path(data)
    if p.is_dir() and any(p.glob("shard-*.npz")):
        seqs = read_distilled(p)
        check_vocabulary(seqs.tokens, vocab_size, str(p))
        return seqs
    return Sequences.windows(read_training_tokens(p, model_dir, vocab_size), window)


def batches(seqs: Sequences, batch_tokens: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One epoch's batches of sequence indices: shuffled, then sorted by length within windows of
    ~50 batches so each batch pads little, each batch at most `batch_tokens` padded tokens."""
    order = rng.permutation(len(seqs))
    lens = seqs.lengths()
    per_window = max(1, 50 * batch_tokens // max(int(lens.mean()), 1))
    out = []
    for lo in range(0, len(order), per_window):
        window = order[lo : lo + per_window]
        window = window[np.argsort(lens[window], kind="stable")]
        cur: list[int] = []
        longest = 0
        for i in window:
            longest_if = max(longest, int(lens[i]))
            if cur and longest_if * (len(cur) + 1) > batch_tokens:
                out.append(np.array(cur))
                cur, longest_if = [], int(lens[i])
            cur.append(int(i))
            longest = longest_if
        if cur:
            out.append(np.array(cur))
    rng.shuffle(out)
    return out


def make_batch(seqs: Sequences, idx: np.ndarray, max_len: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> tokens [B, L] (right-padded with 0), lengths [B], answer starts [B]; sequences longer than
    max_len keep their first max_len tokens."""
    lens = np.minimum(seqs.lengths()[idx], max_len)
    x = np.zeros((len(idx), int(lens.max())), dtype=np.int64)
    for r, i in enumerate(idx):
        x[r, : lens[r]] = seqs.get(int(i))[: lens[r]]
    return (torch.from_numpy(x).to(device), torch.from_numpy(lens).to(device),
            torch.from_numpy(seqs.answer_start[idx]).to(device))
