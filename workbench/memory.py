"""Keep the app's resident memory from creeping up while it serves.

glibc's malloc gives each thread that allocates its own arena (up to 8 per core) and, once a large
block has been freed, raises its mmap threshold so that later large blocks (torch's activations, JSON
bodies) come from those arenas' heaps instead of fresh mappings. A server whose request threads
allocate and free tensors of varying sizes therefore grows in steps that never come back, though
nothing is leaked: Python's own objects grew 4 MiB in a 4-minute soak while the process grew 36 MiB
(tracemalloc, 2026-12-05).

Two remedies, both glibc's and both measured by an A/B soak (benchmarks/reliability.md):
- `limit_heap_growth`: at most ARENAS arenas, and a fixed MMAP_THRESHOLD (no dynamic raise), so a
  large block is its own mapping and goes back to the OS when freed. Equivalent to starting the process
  with MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=262144; called first thing in `app.py`, before any
  thread has made its arena.
- `trim_heap_periodically`: `malloc_trim(0)` every 10 s releases the free pages of every arena.
Elsewhere than glibc both do nothing.

A third cause is no allocator's: Intel MKL, torch's CPU BLAS, keeps the buffer it packs a matrix
product's weights into for each thread that multiplied, until that thread ends (16 MiB a thread for
a Medusa run of the demo). Gradio runs each event, and each `next()` of a streamed one, on whichever
worker of its thread pool is free, and ends a worker after 10 s idle, so with four clients the steps
ran on 4 threads and RSS peaked 21-40 MiB above its resting level (the soak's single samples: up to
+10 %). `on_one_thread` runs every decoding step of the app on one thread, whose buffers are then
made once. The app's engine jobs already take turns (one Gradio concurrency group), so no step
waits longer than it did.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8  # mallopt's parameter numbers (glibc's malloc.h)
ARENAS = 2
MMAP_THRESHOLD = 256 * 1024  # bytes: blocks this large or larger are mapped alone
T = TypeVar("T")
_STEPS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decoding-steps")  # started on first use


def _libc_function(name: str):
    """One of glibc's malloc functions, or None (musl, macOS, Windows)."""
    lib = ctypes.util.find_library("c")
    if lib is None:
        return None
    try:
        return getattr(ctypes.CDLL(lib), name)
    except (OSError, AttributeError):
        return None


def limit_heap_growth() -> bool:
    """Cap glibc's arenas at ARENAS and fix its mmap threshold at MMAP_THRESHOLD. -> whether glibc took
    both settings (False where there is no mallopt)."""
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_ARENA_MAX, ARENAS) == 1 and mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1


def trim_heap_periodically(every_s: float = 10.0) -> threading.Thread | None:
    """Start the daemon thread that trims the heap every `every_s` seconds; None where there is no
    malloc_trim."""
    trim = _libc_function("malloc_trim")
    if trim is None:
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            trim(0)

    thread = threading.Thread(target=loop, name="heap-trim", daemon=True)
    thread.start()
    return thread


def on_one_thread(steps: Iterator[T]) -> Iterator[T]:
    """`steps` (an engine stream), each item computed on the app's one decoding thread whichever thread
    asks for it, so MKL's per-thread buffers exist once (module docstring). The caller still closes
    the stream it opened, on its own thread: closing multiplies nothing, and a close that the garbage
    collector runs on the decoding thread itself could not wait for that thread."""
    while True:
        try:
            item = _STEPS.submit(next, steps).result()
        except StopIteration:
            return
        yield item
