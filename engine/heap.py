"""Python's cyclic garbage collector in a process that decodes: freeze what lives as long as the process,
and count the collections' pauses.

A process with torch and transformers imported tracks some 350,000 objects, and a full collection walks
every one of them: 184-252 ms on a CI-class core (benchmarks/gc_pauses.py). A traced step leaves about 50
tracked objects (its record's lists and dicts). CPython 3.11/3.12 runs a full collection after ten
generation-1 collections once the objects moved into the oldest generation since the last full one reach a
quarter of those that survived it: every few traced runs, whether or not their records are still alive.
The host then stalls while the GPU, one step queued ahead, runs dry; traced demo runs swung between 1.05x
and 1.74x of their untraced time (2026-12-07).

`freeze_heap` moves every object alive into the collector's permanent generation (`gc.freeze`), so later
full collections walk only what was made since: the process owner calls it once its model is loaded, as
vLLM's `freeze_gc_heap` does after start-up. It collects first, since freezing would keep today's garbage
until the next call, and unfreezes before that, so that a cycle frozen by an earlier call that has become
garbage since (an engine let go) is collected too. A frozen cycle that becomes garbage waits for the next
call: whoever lets an engine go calls it again. Library code never calls it: `engine.load` leaves the heap
to the process that owns it.

The collection holds the GIL for some 0.2-0.3 s: in the app a request decoding on another thread waits
that long when a model loads or is let go, and what such a request has alive then is frozen with the rest
(its cycles, once garbage, wait for the next call)."""

from __future__ import annotations

import gc
import time


def freeze_heap() -> int:
    """Collect every generation, then freeze what is alive. -> the objects frozen."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class CollectorPauses:
    """The collector's runs while active (`with`), each as (generation, ms), from gc.callbacks: how much
    of a timed run was the collector's."""

    def __init__(self):
        self.pauses: list[tuple[int, float]] = []
        self.active = False
        self._start = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self.active:
            self.pauses.append((info["generation"], (time.perf_counter() - self._start) * 1e3))

    def __enter__(self) -> CollectorPauses:
        self.active = True
        return self

    def __exit__(self, *exc) -> None:
        self.active = False

    def close(self) -> None:
        """Stop listening (gc.callbacks holds the callback, and so this object, until then)."""
        if self._on in gc.callbacks:
            gc.callbacks.remove(self._on)

    def summary(self) -> dict:
        """Per generation that ran: how many times, total and longest ms."""
        out = {}
        for g in sorted({g for g, _ in self.pauses}):
            ms = [d for gen, d in self.pauses if gen == g]
            out[f"generation_{g}"] = {"count": len(ms), "total_ms": round(sum(ms), 2), "longest_ms": round(max(ms), 2)}
        return out
