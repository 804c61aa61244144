"""The models a workbench offers and the engines it keeps loaded.

A researcher switches between the demo, SmolLM2 and their own folder without restarting the app, so
several engines may be loaded at once; each holds its weights and KV cache, so their number is
bounded (MAX_ENGINES), and so is their memory (`DeviceMemory`): a model is loaded only where its
weights, at the app's dtype, fit in the device's free memory. When a new one is needed and the cache
is full or the memory short, the least recently used engines that no job is using are let go, one at
a time; an engine a job is using is never evicted (the job would lose its model mid-run). A model
that even letting every idle engine go would not make room for is refused in one line before
anything is let go: not an out-of-memory kill of the app and every session in it.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from safetensors import SafetensorError, safe_open

from engine import Engine, ModelLoadError
from engine.heap import freeze_heap
from engine.loading import NAMED_MODELS, base_weight_files, find_heads, heads_dir, resolve_model_dir

from .session import UserError

MAX_ENGINES = 2
AR_ONLY = "none: AR"
GIB = 2**30


class DeviceMemory:
    """The engine cache's view of memory on the device its models load on: what a model needs, with
    `itemsize` bytes per weight (the app's dtype: every model of an app loads with the same options),
    against what `free` says the device has (`engine.engine.device_free_memory`)."""

    def __init__(self, free: Callable[[], int | None], itemsize: int):
        self.free, self.itemsize = free, itemsize

    def need(self, name: str) -> int | None:
        """Bytes a model's weights take once loaded: their element count (from the safetensors
        headers of the files the loader reads, and of the heads file it would take) times itemsize;
        a pickled .bin counts its file's bytes as half precision. None when the folder cannot be
        found or read (the loader then says why)."""
        try:
            folder = resolve_model_dir(name)
            files = base_weight_files(folder)
        except ModelLoadError:
            return None
        heads = find_heads(heads_dir(name, folder))  # the one heads file the loader reads, wherever it is
        files += [heads] if heads is not None else []
        total = 0
        for path in files:
            try:
                total += self._weight_bytes(path)
            except (OSError, ValueError, SafetensorError):  # unreadable: the loader names the file
                return None
        return total

    def _weight_bytes(self, path: Path) -> int:
        if path.suffix != ".safetensors":
            return path.stat().st_size * self.itemsize // 2
        with safe_open(str(path), "pt") as f:
            return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys()) * self.itemsize

    @staticmethod
    def held(engine: Engine) -> int:
        """What letting an engine go frees (`Engine.held_memory`)."""
        return engine.held_memory()


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

    def __init__(self, loader: Callable[[str], Engine], limit: int = MAX_ENGINES, memory: DeviceMemory | None = None):
        if limit < 1:
            raise ValueError(f"the engine cache holds at least one engine, got {limit}")
        self._loader, self.limit, self._memory = loader, limit, memory
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
            self._make_memory(name)
            self._make_room(name)
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
            self._let_go(idle[0])

    def _let_go(self, name: str) -> None:
        """Drop an idle engine and collect it now: the heap is frozen after each load (engine/heap.py), so a
        cycle among its objects would otherwise outlive it until the next load, or for good if that fails."""
        del self._items[name]
        freeze_heap()

    def _make_memory(self, name: str) -> None:
        """Let least recently used idle engines go until `name`'s weights fit in free memory (lock
        held); refuse, letting nothing go, when even all the idle ones would not make room."""
        mem = self._memory
        need, free = (mem.need(name), mem.free()) if mem is not None else (None, None)
        if need is None or free is None:
            return
        idle = [n for n in self._items if not self._users.get(n)]
        busy = len(self._items) - len(idle)
        if need > free + sum(mem.held(self._items[n]) for n in idle):
            raise UserError(_no_memory(name, need, free, busy))
        while need > free and idle:
            self._let_go(idle.pop(0))  # its tensors go now (on CUDA into torch's cache, which `free` counts)
            free = mem.free() or 0
        if need > free:  # what the idle engines held did not come back
            raise UserError(_no_memory(name, need, free, busy))

    def loaded(self) -> list[str]:
        with self._lock:
            return list(self._items)


def _no_memory(name: str, need: int, free: int, busy: int) -> str:
    held = f"; {busy} loaded model{'s are' if busy != 1 else ' is'} in use by a job" if busy else ""
    return (f"{name!r} needs about {_size(need)} for its weights and {_size(free)} is free{held}: "
            "close other programs, or start the app with a smaller --dtype or on another --device")


def _size(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"
