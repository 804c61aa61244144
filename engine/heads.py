"""Medusa heads and the checkpoint formats people have on disk.

A head is `num_layers` ResBlocks `x = x + SiLU(W x + b)` then a d -> V projection, either its own
(FasterDecoding Medusa-1) or the base model's lm_head (shared). All heads run as one batched GEMM
per layer. Head and layer counts always come from the weight keys: public `config.json` files state
them wrongly, and nothing here loads with strict=False.

Formats (detected from the keys):
  faster-decoding  `{h}.{l}.linear.weight`, `{h}.{l}.linear.bias` (l < L), `{h}.{L}.weight`
                   (`medusa_lm_head.pt` / `.safetensors`)
  shared-lm-head   the same without `{h}.{L}.weight`: heads reuse the base lm_head
                   (our `medusa_heads.safetensors`, Medusa's "version 2" code)
  medusa2          either of the above under `medusa_head.` inside a full model state dict
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from .config import ModelLoadError
from .kernels import pointwise
from .tp import SINGLE, TP

# canonical decimal indices only: "00.0." or "٠.0." would name head 0 a second time beside "0.0."
_INDEX = r"(0|[1-9][0-9]{0,5})"
_KEY = re.compile(rf"{_INDEX}\.{_INDEX}\.(linear\.weight|linear\.bias|weight)")
MAX_HEADS = 64  # public checkpoints have 3-5; a tree is never deeper than trees.MAX_DEPTH
MAX_RESBLOCKS = 16


@dataclass(frozen=True)
class HeadLayout:
    format: str  # "faster-decoding" | "shared-lm-head"
    num_heads: int
    num_layers: int
    shared_lm_head: bool


class MedusaHeads(nn.Module):
    """Under tensor parallelism (the seed's split) a rank holds rows `tp.part(dim)` of every ResBlock
    (column-parallel: weight and bias along the output dim) and the same columns of each vocabulary
    projection (row-parallel along hidden size, partial logits all-reduced)."""

    def __init__(self, num_heads: int, num_layers: int, dim: int, vocab_size: int | None, tp: TP = SINGLE):
        super().__init__()
        self.num_heads, self.num_layers, self.dim, self.tp = num_heads, num_layers, dim, tp
        local = dim // tp.world
        # Zero ResBlocks make a fresh head equal the base lm_head (Medusa's initialisation).
        self.weight = nn.Parameter(torch.zeros(num_heads, num_layers, local, dim))
        self.bias = nn.Parameter(torch.zeros(num_heads, num_layers, local))
        self.proj = None if vocab_size is None else nn.Parameter(torch.zeros(num_heads, vocab_size, local))

    @property
    def shared_lm_head(self) -> bool:
        return self.proj is None

    def hidden(self, h: torch.Tensor) -> torch.Tensor:
        """[N, d] base hidden states -> [K, N, d / world] head features (this rank's share), all
        heads batched. Between ResBlocks the shares are gathered (the next block needs all of x)."""
        cols = self.tp.part(self.dim)
        x = h.unsqueeze(0).expand(self.num_heads, -1, -1)
        tail = pointwise.residual_silu if self._fused_tail(h) else pointwise.residual_silu_reference
        for layer in range(self.num_layers):
            w, b = self.weight[:, layer], self.bias[:, layer]
            y = tail(x[..., cols], torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2)))
            x = self.tp.all_gather(y) if layer + 1 < self.num_layers else y
        return x[..., cols] if self.num_layers == 0 else x

    @staticmethod
    def _fused_tail(h: torch.Tensor) -> bool:
        """Whether the ResBlocks' SiLU and residual add run as one kernel (pointwise.residual_silu): on CUDA, in
        inference (the kernel has no backward: training runs the reference). Eager and graphed steps meet the
        same test, so they compute the heads alike."""
        return h.is_cuda and pointwise.triton is not None and not torch.is_grad_enabled()

    def forward(self, h: torch.Tensor, lm_head_weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """[N, d] -> logits [K, N, V] (into `out` when given: contiguous, in the weights' dtype)."""
        x = self.hidden(h)
        if self.proj is None:
            return self.tp.all_reduce(torch.matmul(x, lm_head_weight[:, self.tp.part(self.dim)].t(), out=out))
        return self.tp.all_reduce(torch.bmm(x, self.proj.transpose(1, 2), out=out))

    def state_dict_faster_decoding(self, include_proj: bool = True) -> dict[str, torch.Tensor]:
        """Keys in the FasterDecoding layout (projection only when the heads have their own)."""
        out = {}
        for h in range(self.num_heads):
            for layer in range(self.num_layers):
                out[f"{h}.{layer}.linear.weight"] = self.weight[h, layer].detach().contiguous()
                out[f"{h}.{layer}.linear.bias"] = self.bias[h, layer].detach().contiguous()
            if include_proj and self.proj is not None:
                out[f"{h}.{self.num_layers}.weight"] = self.proj[h].detach().contiguous()
        return out


def detect_layout(keys: list[str], where: str) -> HeadLayout:
    """Read head and layer counts from the keys; any key outside the layout is an error."""
    found: dict[tuple[int, int], set[str]] = {}
    for key in keys:
        m = _KEY.fullmatch(key)
        if not m:
            raise ModelLoadError(f"{where}: key {key!r} matches no Medusa head format "
                                 "(expected '{head}.{layer}.linear.weight|bias' or '{head}.{L}.weight')")
        found.setdefault((int(m[1]), int(m[2])), set()).add(m[3])
    if not found:
        raise ModelLoadError(f"{where}: no Medusa head weights found")
    num_heads = max(h for h, _ in found) + 1
    deepest = max(layer for _, layer in found)
    if num_heads > MAX_HEADS or deepest > MAX_RESBLOCKS:  # before any per-head work
        raise ModelLoadError(f"{where}: keys name {num_heads} heads and layer index {deepest}; at most {MAX_HEADS} "
                             f"heads of {MAX_RESBLOCKS} ResBlocks are supported")
    by_head: dict[int, list[int]] = {}
    for h, layer in found:
        by_head.setdefault(h, []).append(layer)
    per_head_layers = {}
    for h in range(num_heads):
        layers = sorted(by_head.get(h, []))
        if not layers:
            raise ModelLoadError(f"{where}: head {h} is missing (heads 0..{num_heads - 1} expected)")
        resblocks = [layer for layer in layers if "linear.weight" in found[(h, layer)]]
        if resblocks != list(range(len(resblocks))):
            raise ModelLoadError(f"{where}: head {h} has ResBlocks {resblocks}, expected 0..{len(resblocks) - 1}")
        for layer in resblocks:
            if found[(h, layer)] != {"linear.weight", "linear.bias"}:
                missing = {"linear.weight", "linear.bias"} - found[(h, layer)]
                raise ModelLoadError(f"{where}: key '{h}.{layer}.{sorted(missing)[0]}' is missing")
        rest = [layer for layer in layers if layer not in resblocks]
        if rest and (rest != [len(resblocks)] or found[(h, rest[0])] != {"weight"}):
            raise ModelLoadError(f"{where}: head {h} has unexpected keys at layers {rest}")
        per_head_layers[h] = (len(resblocks), bool(rest))
    shapes = set(per_head_layers.values())
    if len(shapes) != 1:
        raise ModelLoadError(f"{where}: heads disagree in layout (ResBlocks, own projection): {per_head_layers}")
    num_layers, has_proj = shapes.pop()
    return HeadLayout("faster-decoding" if has_proj else "shared-lm-head", num_heads, num_layers, not has_proj)


def validate_heads(shapes: Mapping[str, tuple[int, ...]], dim: int, vocab_size: int, where: str) -> HeadLayout:
    """The layout of a heads checkpoint given as key -> shape, every shape checked against the base
    model (hidden size `dim`, `vocab_size`); the one check `load` and `inspect` share."""
    layout = detect_layout(list(shapes), where)
    for h in range(layout.num_heads):
        expected = {f"{h}.{layer}.linear.{part}": (dim, dim) if part == "weight" else (dim,)
                    for layer in range(layout.num_layers) for part in ("weight", "bias")}
        if not layout.shared_lm_head:
            expected[f"{h}.{layout.num_layers}.weight"] = (vocab_size, dim)
        for key, shape in expected.items():
            if tuple(shapes[key]) != shape:
                raise ModelLoadError(f"{where}: key {key!r} has shape {tuple(shapes[key])}, the base model needs {shape}")
    return layout


def heads_from_tensors(shapes: Mapping[str, tuple[int, ...]], get: Callable[[str], torch.Tensor], dim: int,
                       vocab_size: int, where: str, tp: TP = SINGLE) -> MedusaHeads:
    """Build heads from a heads-only checkpoint given as key -> shape (read from a file's header) and a
    reader of one tensor. Counts, layout and every shape are checked against the base model before
    anything is allocated or read (a 3.4 MB file naming 20,000 heads once made the loader allocate
    11.8 GB first); with `tp`, this rank's share is kept."""
    layout = validate_heads(shapes, dim, vocab_size, where)
    heads = MedusaHeads(layout.num_heads, layout.num_layers, dim, None if layout.shared_lm_head else vocab_size, tp)
    part = tp.part(dim)
    with torch.no_grad():
        for h in range(layout.num_heads):
            for layer in range(layout.num_layers):
                heads.weight[h, layer] = get(f"{h}.{layer}.linear.weight")[part]
                heads.bias[h, layer] = get(f"{h}.{layer}.linear.bias")[part]
            if heads.proj is not None:
                heads.proj[h] = get(f"{h}.{layout.num_layers}.weight")[:, part]
    return heads


def heads_from_state_dict(sd: Mapping[str, torch.Tensor], dim: int, vocab_size: int, where: str,
                          tp: TP = SINGLE) -> MedusaHeads:
    """`heads_from_tensors` for a state dict already in memory."""
    return heads_from_tensors({k: tuple(v.shape) for k, v in sd.items()}, sd.__getitem__, dim, vocab_size, where, tp)
