"""The models a workbench offers and the engines it keeps loaded.

A researcher switches between the demo, SmolLM2 and their own folder without restarting the app, so
several engines may be loaded at once; each holds its weights and KV cache, so their number is
bounded (MAX_ENGINES), and so is their memory: before a model is loaded, its weight files (times
LOAD_FACTOR) must fit in the device's free memory (`room`). When a new one is needed and the cache is
full or the memory short, the least recently used engines that no job is using are let go, one at a
time; an engine a job is using is never evicted (the job would lose its model mid-run), so if that
cannot make room the new model is refused with a message instead, before anything is evicted. A
model that does not fit is a one-line refusal, not an out-of-memory kill of the app and every
session in it.
"""

from __future__ import annotations

import gc
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from engine import Engine, ModelLoadError
from engine.loading import NAMED_MODELS, resolve_model_dir

from .session import UserError

MAX_ENGINES = 2
AR_ONLY = "none: AR"
# memory a model takes, per byte of its weight files: a half-precision checkpoint loaded in float32
# (the CPU default) doubles, and the KV cache and activations come on top
LOAD_FACTOR = 2
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")
GIB = 2**30


def weight_bytes(name: str) -> int | None:
    """Bytes of a model's weight files; None when its folder cannot be found (its loader says why)."""
    try:
        folder = resolve_model_dir(name)
    except ModelLoadError:
        return None
    return sum(f.stat().st_size for pattern in WEIGHT_FILES for f in Path(folder).glob(pattern))


def free_bytes(device: torch.device | str) -> int | None:
    """Memory free on the device: CUDA's own count, or the kernel's MemAvailable; None where unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def room(device: torch.device | str) -> Callable[[str], tuple[int, int] | None]:
    """The memory check of an app whose models load on `device`: name -> (bytes needed, bytes free)."""
    def check(name: str) -> tuple[int, int] | None:
        need, free = weight_bytes(name), free_bytes(device)
        return None if need is None or free is None else (LOAD_FACTOR * need, free)

    return check


def model_choices(given: str) -> list[str]:
    """The selector's choices: the model the app was started with, then every named model."""
    return list(dict.fromkeys([given, *NAMED_MODELS]))


def describe(engine: Engine) -> str:
    """The header line: model, heads, dtype, device and attention backend of an engine."""
    heads = f"{engine.num_heads} Medusa heads" if engine.num_heads else AR_ONLY
    dtype = str(engine.model.embed_tokens.weight.dtype).removeprefix("torch.")
    graphs = " · CUDA graphs" if engine.graphs else ""
    folder = f" ({engine.model_dir})" if engine.model_dir is not None else ""
    return (f"**model** `{engine.name}`{folder} · **heads** {heads} · **dtype** {dtype} · **device** {engine.device} · "
            f"**backend** {engine.model.backend}{graphs}")


class Engines:
    """Loaded engines by model name, at most `limit`, least recently used first (see the module doc)."""

    def __init__(self, loader: Callable[[str], Engine], limit: int = MAX_ENGINES,
                 room: Callable[[str], tuple[int, int] | None] | None = None):
        if limit < 1:
            raise ValueError(f"the engine cache holds at least one engine, got {limit}")
        self._loader, self.limit, self._room = loader, limit, room
        self._items: OrderedDict[str, Engine] = OrderedDict()
        self._users: dict[str, int] = {}
        self._lock = threading.RLock()

    def add(self, name: str, engine: Engine) -> None:
        """An engine loaded elsewhere (the one the app started with)."""
        with self._lock:
            self._make_room(name)
            self._items[name] = engine

    def get(self, name: str) -> Engine:
        """The engine of `name`, loaded on first use (UserError when it cannot be loaded or no room is free)."""
        with self._lock:
            if name in self._items:
                self._items.move_to_end(name)
                return self._items[name]
            self._make_room(name)
            self._make_memory(name)
            try:
                engine = self._loader(name)
            except ModelLoadError as e:
                raise UserError(" ".join(str(e).splitlines())) from None
            except (OSError, ValueError) as e:
                raise UserError(f"cannot load {name!r}: {' '.join(str(e).splitlines())}") from None
            self._items[name] = engine
            return engine

    @contextmanager
    def using(self, name: str) -> Iterator[Engine]:
        """The engine of `name`, held for a job: never evicted until the job ends."""
        with self._lock:
            engine = self.get(name)
            self._users[name] = self._users.get(name, 0) + 1
        try:
            yield engine
        finally:
            with self._lock:
                self._users[name] -= 1
                if not self._users[name]:
                    del self._users[name]

    def _make_room(self, name: str) -> None:
        """Evict least recently used idle engines until `name` fits (lock held)."""
        while name not in self._items and len(self._items) >= self.limit:
            idle = [n for n in self._items if not self._users.get(n)]
            if not idle:
                raise UserError(f"{len(self._items)} models are loaded (the most this app keeps) and every one is "
                                f"in use by a job: try {name!r} again when a job ends")
            del self._items[idle[0]]

    def _make_memory(self, name: str) -> None:
        """Evict least recently used idle engines until `name`'s weights fit in free memory (lock held);
        refuse, evicting nothing, when even all the idle ones would not make room."""
        sizes = self._room(name) if self._room is not None else None
        if sizes is None:
            return
        need, free = sizes
        idle = [n for n in self._items if not self._users.get(n)]
        busy = len(self._items) - len(idle)
        if need > free + sum((self._room(n) or (0, 0))[0] for n in idle):
            raise UserError(_no_memory(name, need, free, busy))
        while need > free and idle:
            del self._items[idle.pop(0)]
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            need, free = self._room(name) or (0, 0)
        if need > free:  # the evicted engines' memory did not come back as estimated
            raise UserError(_no_memory(name, need, free, busy))

    def loaded(self) -> list[str]:
        with self._lock:
            return list(self._items)


def _no_memory(name: str, need: int, free: int, busy: int) -> str:
    held = f"; {busy} loaded model{'s are' if busy != 1 else ' is'} in use by a job" if busy else ""
    return (f"{name!r} needs about {need / GIB:.1f} GiB and {free / GIB:.1f} GiB is free{held}: close other "
            "programs, or start the app with a smaller --dtype or on another --device")
