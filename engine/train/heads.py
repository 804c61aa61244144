"""Train Medusa heads on a frozen base model (Medusa-1), one readable loop.

Head k at position t learns the token at t+k+2 (the base lm_head predicts t+1); losses are weighted
0.8^k as in Medusa. The base runs under no_grad, so only the heads' parameters get gradients.
Outputs load with `engine.load(..., heads=PATH)`; with private projections the file uses the
FasterDecoding key layout, so it loads in their code too.
"""

from __future__ import annotations

import json
import math
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
from .data import get_batch, read_training_tokens

DECAY = 0.8


def head_loss(heads: MedusaHeads, base: Transformer, hidden: torch.Tensor, targets: torch.Tensor):
    """hidden [B, T, d], targets [B, T] (targets[:, t] = token at t+1) -> (loss, per-head logits, labels)."""
    k = heads.num_heads
    t = hidden.shape[1] - k - 1  # positions with a label for every head
    h = hidden[:, :t].flatten(0, 1)
    logits = heads(h, base.lm_head.weight)  # [K, B*t, V]
    labels = torch.stack([targets[:, i + 1 : i + 1 + t].flatten() for i in range(k)])  # head i: token at t+i+2
    losses = [F.cross_entropy(logits[i].float(), labels[i]) for i in range(k)]
    return sum(DECAY**i * loss for i, loss in enumerate(losses)), logits, labels, losses


@torch.no_grad()
def evaluate_heads(heads, base, tokens: np.ndarray, seq: int, batch: int, device, n_batches: int = 4) -> list[dict]:
    """Held-out top-1 and top-5 accuracy per head."""
    rng = np.random.default_rng(99)
    total = 0
    per1 = per5 = None
    for _ in range(n_batches):
        x, y = get_batch(tokens, batch, seq, device, rng)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            hidden = base(x, torch.arange(seq, device=device), use_cache=False)
            _, logits, labels, _ = head_loss(heads, base, hidden, y)
        top5 = logits.topk(5, dim=-1).indices
        h1 = (top5[..., 0] == labels).float().sum(-1)
        h5 = (top5 == labels[..., None]).any(-1).float().sum(-1)
        per1 = h1 if per1 is None else per1 + h1
        per5 = h5 if per5 is None else per5 + h5
        total += labels.shape[1]
    return [{"head": i, "top1": float(per1[i]) / total, "top5": float(per5[i]) / total} for i in range(heads.num_heads)]


def eval_heads(model: str, data: str, heads: str | None = None, seq: int = 256, batch: int = 16, n_batches: int = 4,
               device: str | None = None) -> dict:
    """Per-head top-1/top-5 on any token file or text (e.g. real held-out text, where the
    self-distilled held-out numbers of `train_heads` read the model's own continuations)."""
    from ..engine import load

    eng = load(model, heads=heads if heads is not None else True, device=device, dtype="float32", cuda_graphs=False)
    tokens = read_training_tokens(data, resolve_model_dir(model), eng.args.vocab_size)
    if len(tokens) < seq + 2:
        raise ValueError(f"{data}: {len(tokens)} tokens, fewer than one window of {seq + 1}")
    acc = evaluate_heads(eng.heads, eng.model, tokens, seq, batch, eng.device, n_batches)
    return {"model": str(model), "heads": eng.heads_source, "data": str(data), "positions": n_batches * batch *
            (seq - eng.heads.num_heads - 1), "heldout": acc}


@torch.no_grad()
def self_distill_sequences(base: Transformer, tokens: np.ndarray, n: int, prompt_len: int, total_len: int,
                           batch: int, device, rng) -> np.ndarray:
    """[n, total_len] rows: a data prompt, then the base model's own greedy continuation.

    Medusa-2 recommends self-distillation: heads then learn what the model will actually write,
    which is what they must predict at decode time. All rows share one prompt length, so a batch
    decodes in lockstep through the static cache with no padding.
    """
    rows = []
    for lo in range(0, n, batch):
        b = min(batch, n - lo)
        starts = rng.integers(0, len(tokens) - prompt_len - 1, size=b)
        ids = torch.from_numpy(np.stack([tokens[s : s + prompt_len] for s in starts]).astype(np.int64)).to(device)
        base.setup_cache(b, total_len)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            h = base(ids, torch.arange(prompt_len, device=device), start=0)
            out = [ids, base.lm_head(h[:, -1:]).argmax(-1)]
            for pos in range(prompt_len, total_len - 1):
                h = base(out[-1], torch.tensor([pos], device=device), start=pos)
                out.append(base.lm_head(h).argmax(-1))
        rows.append(torch.cat(out, dim=1).cpu().numpy())
    base.cache = None
    return np.concatenate(rows)


def save_heads(heads: MedusaHeads, path: Path, meta: dict) -> None:
    sd = {k: v.to(torch.float16).cpu() for k, v in heads.state_dict_faster_decoding().items()}
    info = {"format": "faster-decoding" if heads.proj is not None else "shared-lm-head",
            "num_heads": str(heads.num_heads), "num_layers": str(heads.num_layers), **{k: str(v) for k, v in meta.items()}}
    tmp = path.with_name(path.name + ".tmp")
    save_file(sd, str(tmp), metadata=info)
    tmp.replace(path)


def train_heads(
    model: str,
    data: str,
    out: str,
    num_heads: int = 4,
    num_layers: int = 1,
    shared_lm_head: bool = True,
    steps: int | None = None,
    minutes: float | None = None,
    batch: int = 32,
    seq: int = 512,
    lr: float = 1e-3,
    eval_every: int = 200,
    self_distill: int = 0,
    distill_batch: int = 256,
    heldout: str | None = None,
    device: str | None = None,
    seed: int = 0,
    resume: bool = True,
    log=print,
) -> dict:
    """Train heads (self_distill=N: on N of the base's own greedy continuations).

    Checkpoints to OUT.ckpt.pt at every evaluation and resumes from it when present.
    """
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model_dir = resolve_model_dir(model)
    base, _, _ = load_base(model_dir, dev, torch.float32)
    base.requires_grad_(False)
    tokens = read_training_tokens(data, model_dir, base.args.vocab_size)
    if len(tokens) < seq + 2:
        raise ValueError(f"{data}: {len(tokens)} tokens, fewer than one training window of {seq + 1}")
    if heldout is not None:
        train, held = tokens, read_training_tokens(heldout, model_dir, base.args.vocab_size)
    else:
        split = int(len(tokens) * 0.98)
        train, held = tokens[:split], tokens[split:] if len(tokens) - split > seq + 2 else tokens
    if self_distill:
        gen_rng = np.random.default_rng(seed + 1)
        n_train = max(batch, self_distill)
        log(f"self-distillation: generating {n_train} greedy continuations of {seq + 1 - 64} tokens")
        train = self_distill_sequences(base, train, n_train, 64, seq + 1, distill_batch, dev, gen_rng)
        held = self_distill_sequences(base, held, max(batch, n_train // 50), 64, seq + 1, distill_batch, dev, gen_rng)
    a = base.args
    heads = MedusaHeads(num_heads, num_layers, a.dim, None if shared_lm_head else a.vocab_size).to(dev)
    if not shared_lm_head:
        with torch.no_grad():
            heads.proj.copy_(base.lm_head.weight.float().expand(num_heads, -1, -1))  # Medusa's initialisation
    opt = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.0)
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    ckpt = out_path.with_name(out_path.name + ".ckpt.pt")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    step, history, t0, total = 0, [], time.time(), steps
    if resume and ckpt.exists():
        state = torch.load(ckpt, map_location=dev, weights_only=True)
        heads.load_state_dict(state["heads"])
        opt.load_state_dict(state["opt"])
        step, history = int(state["step"]), json.loads(state["history"])
        if total is None and int(state.get("total", 0)) > 0:  # a time-budgeted run continues its schedule
            total = int(state["total"])
        rng = np.random.default_rng(seed + step)
        log(f"resumed from {ckpt} at step {step}")
    positions = torch.arange(seq, device=dev)
    timed_from = (step, time.time())  # --minutes: the step count is fixed after 20 timed steps of this run
    while total is None or step < total:
        if total is None and step - timed_from[0] == 20:
            per = (time.time() - timed_from[1]) / 20
            total = timed_from[0] + max(50, int((minutes or 1.0) * 60 / per))
        x, y = get_batch(train, batch, seq, dev, rng)
        with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            hidden = base(x, positions, use_cache=False)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            loss, _, _, losses = head_loss(heads, base, hidden.float(), y)
        frac = step / max(1, total or 10**6)
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % 10 == 0 or step == total:
            sys.stderr.write(f"\rstep {step}/{total or '?'} loss {loss.item():.4f} "
                             f"[{' '.join(f'{v.item():.2f}' for v in losses)}] {time.time() - t0:.0f}s")
            sys.stderr.flush()
        if step % eval_every == 0 or step == total:
            acc = evaluate_heads(heads, base, held, seq, batch, dev)
            history.append({"step": step, "loss": loss.item(), "heldout": acc, "s": round(time.time() - t0, 1)})
            log("\n" + json.dumps(history[-1]))
            torch.save({"heads": heads.state_dict(), "opt": opt.state_dict(), "step": torch.tensor(step),
                        "total": torch.tensor(total or 0), "history": json.dumps(history)}, ckpt)
    acc = history[-1]["heldout"] if history else evaluate_heads(heads, base, held, seq, batch, dev)
    save_heads(heads, out_path, {"base_model": model_dir.name, "steps": step, "self_distill": self_distill})
    report = {"steps": step, "seconds": time.time() - t0, "heldout": acc, "history": history, "out": str(out_path)}
    out_path.with_suffix(".json").write_text(json.dumps(report, indent=1))
    return report
