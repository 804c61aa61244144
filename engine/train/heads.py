"""Train Medusa heads on a frozen base model (Medusa-1), one readable loop.

Head k at position t learns the token at t+k+2 (the base lm_head predicts t+1), only where that token
was written by the model (a self-distilled answer; every position of plain text), with losses
weighted 0.8^k as in Medusa. The base runs under no_grad in the training dtype; only the heads learn.

Scale: a real vocabulary makes the logits the whole cost (49,152 x 576 per head and token for
SmolLM2), and [heads, tokens, vocab] logits of one batch would not fit. `chunked_head_loss` runs the
heads' ResBlocks once, then projects, scores and back-propagates `chunk` positions at a time into
the ResBlock outputs, so at most [chunk, vocab] logits exist at once; the ResBlocks then get their
gradient in one backward. The result equals the unchunked loss and gradient (tested).

Schedule: linear warm-up over the first `warmup` fraction of the run, then cosine decay to 10 %.
The run's length is its epochs, or with `minutes` a wall-clock budget: the schedule then follows the
fraction of the budget spent and the loop stops when it is spent, so a budgeted run ends decayed.
Checkpoints (OUT.ckpt.pt: heads, optimiser, position in the data, training seconds, history) are
written every `checkpoint_minutes`, at the end and on SIGTERM/SIGINT; the same command resumes.
"""

from __future__ import annotations

import json
import math
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from ..heads import MedusaHeads
from ..loading import load_base, resolve_model_dir
from ..model import Transformer
from .data import Sequences, batches, check_vocabulary, make_batch
from .hidden import HiddenStates, cache_fits, forward_hidden

DECAY = 0.8
IGNORE = -100
CHUNK = 8192  # positions whose logits exist at once in the loss


def head_targets(tokens: torch.Tensor, lengths: torch.Tensor, starts: torch.Tensor, num_heads: int):
    """Which positions train the heads, and each head's label there.

    Position t counts when t >= answer_start - 1 (its hidden state is one the heads see at decode
    time: the last prompt token or a generated one) and head 0 has a label (t + 2 < length).
    -> (flat indices into [B, L] of those positions, labels [K, N] with IGNORE past a sequence's end)."""
    b, seq_len = tokens.shape
    t = torch.arange(seq_len, device=tokens.device)[None]
    use = (t >= starts[:, None] - 1) & (t + 2 < lengths[:, None])
    rows, cols = use.nonzero(as_tuple=True)
    labels = []
    for k in range(num_heads):
        j = cols + k + 2
        ok = j < lengths[rows]
        labels.append(torch.where(ok, tokens[rows, j.clamp(max=seq_len - 1)], IGNORE))
    return rows * seq_len + cols, torch.stack(labels)


def chunked_head_loss(heads: MedusaHeads, lm_head: torch.Tensor, hidden: torch.Tensor, labels: torch.Tensor,
                      chunk: int = CHUNK, train: bool = True) -> tuple[float, list[float], torch.Tensor, torch.Tensor]:
    """Medusa's loss sum_k 0.8^k CE_k over hidden [N, d] and labels [K, N], back-propagated into the
    heads when `train`, never holding more than [chunk, V] logits. Head k projects through its own
    vocabulary matrix when it has one (`heads.proj[k]`, trained with it), else through the shared `lm_head`.
    -> (loss, per-head losses, per-head top-1 hits [K], per-head top-5 hits [K]); counts: labels != IGNORE."""
    feats = heads.hidden(hidden)  # [K, N, d] (the ResBlocks, with their graph)
    work = feats.detach().requires_grad_(train)
    # each head's own projection as a leaf of its own: indexing heads.proj inside the loop would give every
    # chunk's backward a full [K, V, d] gradient to add; these gather [V, d] each, handed over once at the end
    own = None if heads.proj is None else [p.detach().requires_grad_(train) for p in heads.proj]
    k_heads, n = labels.shape
    counts = (labels != IGNORE).sum(-1).clamp(min=1)
    losses = torch.zeros(k_heads, device=hidden.device)
    top1 = torch.zeros(k_heads, device=hidden.device)
    top5 = torch.zeros(k_heads, device=hidden.device)
    for k in range(k_heads):
        for lo in range(0, n, chunk):
            y = labels[k, lo : lo + chunk]
            with torch.set_grad_enabled(train):
                proj = lm_head if own is None else own[k]
                logits = (work[k, lo : lo + chunk] @ proj.t()).float()  # [chunk, V]
                ce = F.cross_entropy(logits, y, ignore_index=IGNORE, reduction="sum") / counts[k]
                if train:
                    (DECAY**k * ce).backward()
            with torch.no_grad():
                losses[k] += ce.detach()
                best = logits.detach().topk(5, dim=-1).indices
                valid = y != IGNORE
                top1[k] += ((best[:, 0] == y) & valid).sum()
                top5[k] += ((best == y[:, None]).any(-1) & valid).sum()
    if train:
        feats.backward(work.grad)
        if own is not None:
            heads.proj.backward(torch.stack([p.grad for p in own]))
    total = sum(DECAY**k * float(losses[k]) for k in range(k_heads))
    return total, losses.tolist(), top1, top5


@torch.no_grad()
def evaluate_heads(heads: MedusaHeads, base: Transformer, seqs: Sequences, batch_tokens: int, max_len: int,
                   device, max_positions: int = 200_000) -> list[dict]:
    """Held-out top-1 and top-5 accuracy per head (positions as in training, at most max_positions)."""
    rng = np.random.default_rng(99)
    k = heads.num_heads
    hits1 = torch.zeros(k, device=device)
    hits5 = torch.zeros(k, device=device)
    total = torch.zeros(k, device=device)
    for idx in batches(seqs, batch_tokens, rng):
        x, lens, starts = make_batch(seqs, idx, max_len, device)
        pos, labels = head_targets(x, lens, starts, k)
        hidden = forward_hidden(base, x).flatten(0, 1)[pos]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=hidden.dtype == torch.bfloat16):
            _, _, t1, t5 = chunked_head_loss(heads, base.lm_head.weight, hidden, labels, train=False)
        hits1 += t1
        hits5 += t5
        total += (labels != IGNORE).sum(-1)
        if float(total[0]) >= max_positions:
            break
    return [{"head": i, "top1": round(float(hits1[i] / total[i].clamp(min=1)), 4),
             "top5": round(float(hits5[i] / total[i].clamp(min=1)), 4), "positions": int(total[i])} for i in range(k)]


def lr_at(progress: float, lr: float, warmup: float) -> float:
    """Linear warm-up over the first `warmup` of the run, then cosine to 10 % of lr."""
    p = min(max(progress, 0.0), 1.0)
    if warmup > 0 and p < warmup:
        return lr * (p / warmup)
    frac = (p - warmup) / max(1e-9, 1 - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def save_heads(heads: MedusaHeads, path: Path, meta: dict) -> None:
    sd = {k: v.to(torch.float16).cpu() for k, v in heads.state_dict_faster_decoding().items()}
    info = {"format": "faster-decoding" if heads.proj is not None else "shared-lm-head",
            "num_heads": str(heads.num_heads), "num_layers": str(heads.num_layers), **{k: str(v) for k, v in meta.items()}}
    tmp = path.with_name(path.name + ".tmp")
    save_file(sd, str(tmp), metadata=info)
    tmp.replace(path)


class _Stop:
    """SIGTERM/SIGINT ask the loop to checkpoint and leave after the current step (a device call or
    a scheduler ending the job must not lose the run)."""

    def __init__(self):
        self.requested = False
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: no signal handling there
                pass
        return self

    def _handle(self, *_):
        self.requested = True

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def train_heads(
    model: str,
    train: Sequences,
    held: Sequences,
    out: str,
    num_heads: int = 4,
    num_layers: int = 1,
    shared_lm_head: bool = True,
    epochs: float | None = None,
    minutes: float | None = None,
    batch_tokens: int = 65536,
    max_len: int = 2048,
    lr: float = 1e-3,
    warmup: float = 0.03,
    eval_every: int = 200,
    checkpoint_minutes: float = 2.0,
    device: str | None = None,
    dtype: str | None = None,
    seed: int = 0,
    resume: bool = True,
    cache_hidden: bool | None = None,
    meta: dict | None = None,
    log=print,
) -> dict:
    """Train heads on `train` (evaluating on `held`), for `epochs` (default 1) or `minutes` of training.
    `cache_hidden`: compute the base's hidden states once (default: when they fit the GPU; see hidden.py)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype or ("bfloat16" if dev.type == "cuda" else "float32")]
    model_dir = resolve_model_dir(model)
    base, _, _ = load_base(model_dir, dev, dt)
    a = base.args
    heads = MedusaHeads(num_heads, num_layers, a.dim, None if shared_lm_head else a.vocab_size).to(dev)
    if not shared_lm_head:
        with torch.no_grad():
            heads.proj.copy_(base.lm_head.weight.float().expand(num_heads, -1, -1))  # Medusa's initialisation
    lm_head = base.lm_head.weight  # the training dtype: the head GEMMs run there, the heads' weights stay fp32
    opt = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.0)
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    ckpt = out_path.with_name(out_path.name + ".ckpt.pt")
    torch.manual_seed(seed)
    epoch_batches = len(batches(train, batch_tokens, np.random.default_rng(seed)))
    total_steps = None if minutes else max(1, round((epochs or 1.0) * epoch_batches))
    state = {"step": 0, "epoch": 0, "in_epoch": 0, "train_s": 0.0, "tokens": 0, "history": []}
    if resume and ckpt.exists():
        saved = torch.load(ckpt, map_location=dev, weights_only=True)
        heads.load_state_dict(saved["heads"])
        opt.load_state_dict(saved["opt"])
        state = json.loads(saved["state"])
        log(f"train-heads: resumed from {ckpt} at step {state['step']} ({state['train_s']:.0f} s trained)")

    def progress() -> float:
        return state["train_s"] / (minutes * 60) if minutes else state["step"] / total_steps

    def checkpoint() -> None:
        torch.save({"heads": heads.state_dict(), "opt": opt.state_dict(), "state": json.dumps(state)}, ckpt)

    def evaluate() -> None:
        acc = evaluate_heads(heads, base, held, batch_tokens, max_len, dev)
        state["history"].append({"step": state["step"], "tokens": state["tokens"], "train_s": round(state["train_s"], 1),
                                 "heldout": acc})
        log("train-heads: held-out " + " ".join(f"h{r['head'] + 1} {r['top1']:.3f}/{r['top5']:.3f}" for r in acc)
            + " (top-1/top-5)")

    if cache_hidden is None:
        cache_hidden = cache_fits(base, train, max_len, dev)
    t0 = time.time()
    hidden_states = HiddenStates(base, train, max_len, cache_hidden, batch_tokens)
    if cache_hidden:
        log(f"train-heads: the base's hidden states of all {len(hidden_states.cache)} positions cached on {dev} "
            f"in {time.time() - t0:.1f} s ({hidden_states.cache.nbytes / 2**30:.1f} GiB)")
    log(f"train-heads: {len(train)} sequences ({train.answer_tokens()} model-written tokens), {epoch_batches} "
        f"batches of <= {batch_tokens} tokens per epoch; " + (f"{minutes} min budget" if minutes else
                                                             f"{total_steps} steps"))
    last_log = last_ckpt = time.time()
    with _Stop() as stop:
        while progress() < 1.0 and not stop.requested:
            order = batches(train, batch_tokens, np.random.default_rng(seed + state["epoch"]))
            while state["in_epoch"] < len(order) and progress() < 1.0 and not stop.requested:
                t0 = time.time()
                idx = order[state["in_epoch"]]
                x, lens, starts = make_batch(train, idx, max_len, dev)
                pos, labels = head_targets(x, lens, starts, num_heads)
                hidden = hidden_states.get(idx, x, pos)
                for g in opt.param_groups:
                    g["lr"] = lr_at(progress(), lr, warmup)
                opt.zero_grad(set_to_none=True)
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dt == torch.bfloat16):
                    loss, per_head, top1, _ = chunked_head_loss(heads, lm_head, hidden, labels)
                opt.step()
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                state["train_s"] += time.time() - t0
                state["step"] += 1
                state["in_epoch"] += 1
                state["tokens"] += int((labels[0] != IGNORE).sum())
                if time.time() - last_log >= 10 or state["step"] == 1:
                    acc = (top1 / (labels != IGNORE).sum(-1).clamp(min=1)).tolist()
                    left = max(0.0, state["train_s"] * (1 - progress()) / max(progress(), 1e-9))
                    log(f"train-heads: step {state['step']}{'/' + str(total_steps) if total_steps else ''} epoch "
                        f"{state['epoch']} ({state['in_epoch']}/{len(order)}) loss {loss:.3f} [{' '.join(f'{v:.2f}' for v in per_head)}] "
                        f"top-1 [{' '.join(f'{v:.2f}' for v in acc)}] lr {opt.param_groups[0]['lr']:.2e} "
                        f"{state['tokens'] / max(state['train_s'], 1e-9):.0f} positions/s, ETA {left:.0f} s")
                    last_log = time.time()
                if state["step"] % eval_every == 0:
                    evaluate()
                if time.time() - last_ckpt >= checkpoint_minutes * 60:
                    checkpoint()
                    last_ckpt = time.time()
            if state["in_epoch"] >= len(order):
                state["epoch"] += 1
                state["in_epoch"] = 0
        if not state["history"] or state["history"][-1]["step"] != state["step"]:
            evaluate()
        checkpoint()
    finished = progress() >= 1.0
    if not finished:
        log(f"train-heads: stopped at step {state['step']}; checkpoint {ckpt}: run the same command to resume")
    save_heads(heads, out_path, {"base_model": model_dir.name, "steps": state["step"], "positions": state["tokens"],
                                 **(meta or {})})
    report = {"steps": state["step"], "epochs": round(state["epoch"] + state["in_epoch"] / max(epoch_batches, 1), 3),
              "train_seconds": round(state["train_s"], 1), "positions": state["tokens"], "finished": finished,
              "train_sequences": len(train), "train_answer_tokens": train.answer_tokens(),
              "heldout_sequences": len(held), "heldout": state["history"][-1]["heldout"], "history": state["history"],
              "settings": {"num_heads": num_heads, "num_layers": num_layers, "shared_lm_head": shared_lm_head,
                           "epochs": epochs, "minutes": minutes, "batch_tokens": batch_tokens, "lr": lr,
                           "warmup": warmup, "dtype": str(dt).removeprefix("torch."), "seed": seed,
                           "cache_hidden": cache_hidden},
              "out": str(out_path), **(meta or {})}
    out_path.with_suffix(".json").write_text(json.dumps(report, indent=1))
    return report


def eval_heads(model: str, data: Sequences, heads: str | None = None, batch_tokens: int = 16384, max_len: int = 2048,
               device: str | None = None, max_positions: int = 200_000) -> dict:
    """Per-head top-1/top-5 on any sequences: a held-out self-distillation folder, or real text (where
    the numbers read the data's own continuations, not the model's)."""
    from ..engine import load

    eng = load(model, heads=heads if heads is not None else True, device=device, dtype="float32", cuda_graphs=False)
    check_vocabulary(data.tokens, eng.args.vocab_size, "the data")
    acc = evaluate_heads(eng.heads, eng.model, data, batch_tokens, max_len, eng.device, max_positions)
    return {"model": str(model), "heads": eng.heads_source, "sequences": len(data), "heldout": acc}


def log_stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
