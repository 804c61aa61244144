"""workbench/memory.py: the app's allocator settings, heap-trim thread and decoding thread (what they
buy is measured by the soak, benchmarks/reliability.md, not here)."""

import ctypes
import os
import platform
import subprocess
import sys
import threading
from collections.abc import Callable

import pytest

from engine.prompts import Prompt
from workbench.memory import ARENAS, _libc_function, trim_heap_periodically


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trim_thread_runs_and_trims_where_glibc_has_malloc_trim():
    trim = _libc_function("malloc_trim")
    assert trim is not None and trim(0) in (0, 1)  # 1: memory was released, 0: none could be
    thread = trim_heap_periodically(every_s=0.01)
    assert thread is not None and thread.daemon and thread.is_alive()


PROBE = """
import ctypes, ctypes.util, sys, threading
from workbench.memory import limit_heap_growth
if sys.argv[1] == "limited":
    assert limit_heap_growth()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc.mallinfo2.restype = Info
libc.free(libc.malloc(4 << 20))  # freeing a mapped 4 MiB block raises glibc's dynamic mmap threshold past 1 MiB
before = libc.mallinfo2().hblks
block = libc.malloc(1 << 20)
print(libc.mallinfo2().hblks - before)  # 1: the 1 MiB block is a mapping of its own; 0: it came from the heap
meet = threading.Barrier(6)
def hold():
    b = libc.malloc(1000)
    meet.wait()
    libc.free(b)
threads = [threading.Thread(target=hold) for _ in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
libc.malloc_stats()  # one "Arena N:" paragraph per arena, on stderr
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or not hasattr(ctypes.CDLL(None), "mallinfo2"),
                    reason="mallopt and mallinfo2 are glibc's (2.33+)")
def test_limited_heap_maps_large_blocks_alone_and_keeps_two_arenas():
    """In a child process (this one keeps its settings), against the same probe without the limits:
    after a large block was freed, a 1 MiB block is still mapped alone (not carved from a heap that
    never shrinks), and six threads that allocate at once share at most two arenas."""
    def probe(mode: str) -> tuple[int, int]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}  # glibc's defaults, whoever runs it
        out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0, out.stderr
        return int(out.stdout), sum(line.startswith("Arena ") for line in out.stderr.splitlines())

    assert probe("limited") == (1, ARENAS)
    mapped, arenas = probe("default")
    assert mapped == 0 and arenas > ARENAS  # the probe can tell: glibc's defaults behave otherwise here


def test_every_decoding_step_runs_on_one_thread_whichever_thread_asks(wb, tabs):
    """MKL keeps its packing buffers per thread that multiplied (16 MiB a thread for the demo), so the
    app's steps must not run on whichever Gradio worker asks. Each path that decodes is asked from
    threads of its own, as Gradio does: a page's decode with every streamed update pulled by a fresh
    thread, the API, and a Tune job (Workbench.generate). Each runs forwards, all on one thread that
    none of them is."""
    ran_on: list[threading.Thread] = []  # thread objects, not idents: a joined thread's ident is reused
    hook = wb.engine.model.register_forward_pre_hook(lambda *_: ran_on.append(threading.current_thread()))
    askers: list[threading.Thread] = []

    def ask(fn: Callable[[], object]) -> int:
        """Run fn on a new thread -> how many forwards ran meanwhile."""
        before = len(ran_on)
        t = threading.Thread(target=fn)
        askers.append(t)
        t.start()
        t.join(120)
        return len(ran_on) - before

    try:
        page = tabs.decode.decode(wb.sessions.get("page"), "def main():\n", "demo_tuned", "", max_new_tokens=24)
        updates: list[dict] = []
        forwards = {"page": 0}
        while not updates or not (updates[-1].get("done") or "error" in updates[-1]):
            forwards["page"] += ask(lambda: updates.append(next(page, {"error": "ended without a last update"})))
        forwards["api"] = ask(lambda: tabs.api.generate(wb.sessions.get("api"), "import os\n", "demo_tuned",
                                                        max_new_tokens=24))
        forwards["tune"] = ask(lambda: tabs.tune.collect(wb.sessions.get("tune"), [Prompt("x = 1\n", ["x = 1\n"], 0)], 16))
    finally:
        hook.remove()
    assert updates[-1].get("done") and all(forwards.values()), (updates[-1], forwards)
    assert set(ran_on).isdisjoint(askers), "a forward ran on the thread that asked for its step"
    assert len(set(ran_on)) == 1, f"forwards ran on {len(set(ran_on))} threads"
