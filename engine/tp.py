"""Tensor parallelism over torch.distributed (NCCL on GPUs, gloo on CPU), launched with torchrun.

Megatron-style split by hidden size, so each layer needs two all-reduces and nothing else:
  column-parallel (weight rows = output features split): q/k/v, gate/up, each Medusa ResBlock
  row-parallel (weight columns = input features split, partial sums all-reduced): o_proj, down_proj,
      and each Medusa head's vocabulary projection (its own or the shared lm_head's columns)
  replicated: embeddings, norms, the base lm_head
The base lm_head is replicated rather than vocabulary-parallel: every rank then holds the full,
identical logits (its input is the all-reduced hidden state, identical on every rank), so top-k,
tree assembly, verification, sampling with a shared seed and KV compaction make the same choices on
every rank with no gather of logits and no broadcast of decisions; the cost is one vocab x dim matrix
per rank. The KV cache splits by KV head with the attention heads. A biased row-parallel layer adds
its bias on rank 0 only, so the all-reduce counts it once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .config import ModelArgs, ModelLoadError

COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW_PARALLEL = ("o_proj", "down_proj")


@dataclass(frozen=True)
class TP:
    rank: int = 0
    world: int = 1
    group: bool = False  # joined a process group: collectives run even at world 1 (torchrun tp=1)

    @property
    def collective(self) -> bool:
        return self.world > 1 or self.group

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.collective:
            dist.all_reduce(x)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's last-dim shard, in rank order."""
        if not self.collective:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    def shared_seed(self, seed: int) -> int:
        """Rank 0's seed on every rank, so sampling draws agree."""
        if not self.collective:
            return seed
        t = torch.tensor([seed], dtype=torch.long)
        if dist.get_backend() == "nccl":
            t = t.cuda()
        dist.broadcast(t, 0)
        return int(t)

    def part(self, n: int) -> slice:
        """This rank's contiguous share of n features."""
        size = n // self.world
        return slice(self.rank * size, (self.rank + 1) * size)


SINGLE = TP()


def check_divisible(args: ModelArgs, world: int, where: str) -> None:
    for what, n in (("num_attention_heads", args.n_heads), ("num_key_value_heads", args.n_kv_heads),
                    ("intermediate_size", args.intermediate_size), ("hidden_size", args.dim)):
        if n % world:
            raise ModelLoadError(f"{where}: --tp {world} does not divide {what} = {n}")


def shard_dim(name: str) -> int | None:
    """Which dim of a base-model tensor this rank reads a share of (None: the whole tensor).
    Biases of row-parallel layers are read whole (and kept on rank 0 only)."""
    parts = name.split(".")
    if len(parts) < 2 or parts[-2] not in COLUMN_PARALLEL + ROW_PARALLEL:
        return None
    if parts[-2] in COLUMN_PARALLEL:
        return 0
    return 1 if parts[-1] == "weight" else None


def is_row_parallel_bias(name: str) -> bool:
    parts = name.split(".")
    return len(parts) >= 2 and parts[-2] in ROW_PARALLEL and parts[-1] == "bias"


def init_from_env(device_type: str) -> tuple[TP, torch.device]:
    """Join the torchrun group (env RANK/WORLD_SIZE/LOCAL_RANK); NCCL on CUDA, gloo on CPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo", rank=rank, world_size=world)
    return TP(rank, world, group=True), device
