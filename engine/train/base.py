"""Train the demo base model from scratch (our Transformer, saved in the HF Llama layout).

One readable loop, nanoGPT style: random windows of a uint16 token file, AdamW, warmup then
cosine decay over a step count fixed from a time budget after a short timing warm-up.

`future_heads=K` adds an auxiliary loss while the base trains (multi-token prediction, as in
Gloeckle et al. 2024 and Medusa-2's joint stage): K Medusa-shaped heads learn the tokens at
t+2..t+K+1 from the last hidden state, weighted `future_weight` x 0.8^k. A base trained only for the
next token keeps little about later tokens in that state, and Medusa-1 heads, which read only it,
cannot recover what is not there. These heads are thrown away; the shipped ones are trained
afterwards on the frozen base (train/heads.py).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from ..config import ModelArgs
from ..heads import MedusaHeads
from ..loading import build_model
from ..model import Transformer
from .data import get_batch
from .heads import DECAY

DEMO_SHAPE = dict(vocab_size=8192, dim=384, n_layers=5, n_heads=6, n_kv_heads=2, head_dim=64,
                  intermediate_size=896, norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=1024,
                  tie_word_embeddings=True)


def future_loss(heads: MedusaHeads, model: Transformer, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """sum_k 0.8^k CE of head k predicting the token at t+k+2 (targets[:, t] is the token at t+1).
    Unchunked, with gradients into the base: the demo's vocabulary of 8,192 keeps the logits small."""
    k = heads.num_heads
    t = hidden.shape[1] - k - 1  # positions with a label for every head
    logits = heads(hidden[:, :t].flatten(0, 1), model.lm_head.weight)  # [K, B*t, V]
    return sum(DECAY**i * F.cross_entropy(logits[i].float(), targets[:, i + 1 : i + 1 + t].flatten()) for i in range(k))


def hf_config(args: ModelArgs, eos_token_id: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": args.vocab_size,
        "hidden_size": args.dim, "intermediate_size": args.intermediate_size, "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads, "num_key_value_heads": args.n_kv_heads, "head_dim": args.head_dim,
        "rms_norm_eps": args.norm_eps, "rope_theta": args.rope_theta, "max_position_embeddings": args.max_position_embeddings,
        "tie_word_embeddings": args.tie_word_embeddings, "attention_bias": False, "mlp_bias": False,
        "hidden_act": "silu", "bos_token_id": None, "eos_token_id": eos_token_id, "torch_dtype": "float16",
    }


def hf_state_dict(model: Transformer, dtype=torch.float16) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in model.state_dict().items():
        if k == "lm_head.weight" and model.args.tie_word_embeddings:
            continue
        out[k if k == "lm_head.weight" else f"model.{k}"] = v.detach().to(dtype).contiguous().cpu()
    return out


def init_weights(model: Transformer, std: float = 0.02) -> None:
    for name, p in model.named_parameters():
        if p.dim() == 2:  # residual-branch outputs scaled down by depth (GPT-2 style)
            residual = name.endswith(("o_proj.weight", "down_proj.weight"))
            torch.nn.init.normal_(p, std=std / math.sqrt(2 * model.args.n_layers) if residual else std)
        elif name.endswith("bias"):
            torch.nn.init.zeros_(p)


@torch.no_grad()
def evaluate(model: Transformer, tokens: np.ndarray, seq: int, batch: int, device, n_batches: int = 8) -> float:
    model.eval()
    gen = np.random.default_rng(1234)
    losses = []
    for _ in range(n_batches):
        x, y = get_batch(tokens, batch, seq, device, gen)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            h = model(x, torch.arange(seq, device=device), use_cache=False)
            loss = F.cross_entropy(model.lm_head(h).float().flatten(0, 1), y.flatten())
        losses.append(loss.item())
    model.train()
    return float(np.mean(losses))


def train_base(data_dir: str | Path, out_dir: str | Path, minutes: float = 5.0, batch: int = 64, seq: int = 1024,
               lr: float = 2e-3, seed: int = 0, steps: int | None = None, device: str | None = None,
               future_heads: int = 0, future_weight: float = 0.2, log=print) -> dict:
    data_dir, out = Path(data_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(seed)
    train = np.fromfile(data_dir / "train.bin", dtype=np.uint16)
    held = np.fromfile(data_dir / "heldout.bin", dtype=np.uint16)
    args = ModelArgs(**DEMO_SHAPE)
    model = build_model(args, device=dev)
    init_weights(model)
    aux = MedusaHeads(future_heads, 1, args.dim, None).to(dev) if future_heads else None
    params = list(model.parameters()) + (list(aux.parameters()) if aux is not None else [])
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=dev.type == "cuda")
    rng = np.random.default_rng(seed)
    positions = torch.arange(seq, device=dev)
    warmup, total, step, t0 = 100, steps, 0, time.time()
    best = (float("inf"), None)
    history = []
    while total is None or step < total:
        if step == 50 and total is None:  # fix the schedule from the measured speed
            per_step = (time.time() - t0) / 50
            total = max(200, int(minutes * 60 / per_step))
            log(f"{per_step * 1000:.1f} ms/step -> {total} steps")
        frac = (step - warmup) / max(1, (total or 10**9) - warmup)
        cur_lr = lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(max(frac, 0), 1))))
        for g in opt.param_groups:
            g["lr"] = cur_lr
        x, y = get_batch(train, batch, seq, dev, rng)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            h = model(x, positions, use_cache=False)
            loss = F.cross_entropy(model.lm_head(h).float().flatten(0, 1), y.flatten())
            future = future_loss(aux, model, h, y) if aux is not None else None
        opt.zero_grad(set_to_none=True)
        (loss if future is None else loss + future_weight * future).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % 250 == 0 or step == total:
            hl = evaluate(model, held, seq, batch, dev)
            history.append({"step": step, "train_loss": loss.item(), "heldout_loss": hl, "s": time.time() - t0,
                            **({"train_future_loss": future.item()} if future is not None else {})})
            log(json.dumps(history[-1]))
            if hl < best[0]:
                best = (hl, {k: v.detach().clone() for k, v in model.state_dict().items()})
    model.load_state_dict(best[1])
    eos = int(len(train) and train[-1])  # every file ends with EOT, so the last token is its id
    (out / "config.json").write_text(json.dumps(hf_config(args, eos), indent=1))
    save_file(hf_state_dict(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    report = {"steps": step, "batch": batch, "seq": seq, "tokens_seen": step * batch * seq, "seconds": time.time() - t0,
              "best_heldout_loss": best[0], "future_heads": future_heads,
              "future_weight": future_weight if future_heads else 0.0, "params": sum(p.numel() for p in model.parameters()),
              "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "history": history}
    (out / "train_base.json").write_text(json.dumps(report, indent=1))
    return report
