"""workbench/memory.py: the app's allocator settings and heap-trim thread (what they buy is measured
by the soak, benchmarks/reliability.md, not here)."""

import ctypes
import os
import platform
import subprocess
import sys

import pytest

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
