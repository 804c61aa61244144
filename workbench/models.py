"""The models a workbench offers and the engines it keeps loaded.

A researcher switches between the demo, SmolLM2 and their own folder without restarting the app, so
several engines may be loaded at once; each holds its weights and KV cache, so their number is
bounded (MAX_ENGINES). When a new one is needed and the cache is full, the least recently used engine
that no job is using is let go; an engine a job is using is never evicted (the job would lose its
model mid-run), so if all of them are busy the new model is refused with a message instead.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from engine import Engine, ModelLoadError
from engine.loading import NAMED_MODELS

from .session import UserError

MAX_ENGINES = 2
AR_ONLY = "none: AR"


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

    def __init__(self, loader: Callable[[str], Engine], limit: int = MAX_ENGINES):
        if limit < 1:
            raise ValueError(f"the engine cache holds at least one engine, got {limit}")
        self._loader, self.limit = loader, limit
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

    def loaded(self) -> list[str]:
        with self._lock:
            return list(self._items)
