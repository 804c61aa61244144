"""workbench/memory.py: the app's heap-trim thread (what it buys is measured by the soak,
benchmarks/reliability.md, not here)."""

import platform

import pytest

from workbench.memory import _malloc_trim, trim_heap_periodically


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trim_thread_runs_and_trims_where_glibc_has_malloc_trim():
    trim = _malloc_trim()
    assert trim is not None and trim(0) in (0, 1)  # 1: memory was released, 0: none could be
    thread = trim_heap_periodically(every_s=0.01)
    assert thread is not None and thread.daemon and thread.is_alive()
