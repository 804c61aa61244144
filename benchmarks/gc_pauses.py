"""Python's garbage collections during decoding runs: `PYTHONPATH=. python3 benchmarks/gc_pauses.py [--device cpu]
[--freeze]`.

`--freeze` collects and then freezes the heap after the load (`gc.freeze`: the objects alive then are
left out of every later collection, as vLLM's `freeze_gc_heap` does after start-up;
benchmarks/patches/freeze_heap.diff put it in engine.load for a while). Then, on the demo model: one
300-token greedy AR run untraced and one traced (one prompt), and four traced batches of 12 prompts x
256 tokens whose results are kept (as a benchmark's rounds or a workbench's sessions keep theirs); per
run, the collections by generation (count, total ms, longest ms, from gc.callbacks) and the objects
the collector tracks after it. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import engine

PROMPT = "def read_config(path):"


class Pauses:
    """Each collection's generation and duration, as gc.callbacks reports them."""

    def __init__(self):
        self.runs: list[tuple[int, float]] = []
        self._start = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.runs.append((info["generation"], (time.perf_counter() - self._start) * 1e3))

    def summary(self) -> dict:
        out = {}
        for g in sorted({g for g, _ in self.runs}):
            ms = [d for gen, d in self.runs if gen == g]
            out[f"generation_{g}"] = {"count": len(ms), "total_ms": round(sum(ms), 2), "longest_ms": round(max(ms), 2)}
        self.runs.clear()
        return out


def main(device: str, freeze: bool) -> None:
    eng = engine.load("demo", device=device)
    if freeze:
        gc.collect()
        gc.freeze()
    pauses = Pauses()
    rec = {"device": device, "frozen_objects": gc.get_freeze_count(), "runs": {}}
    runs = {"ar untraced, 300 tokens": ([PROMPT], 300, False), "ar traced, 300 tokens": ([PROMPT], 300, True)}
    runs.update({f"ar traced, 12 prompts x 256 tokens, kept, {i + 1}": ([PROMPT] * 12, 256, True) for i in range(4)})
    kept = []
    for name, (prompts, tokens, trace) in runs.items():
        t0 = time.perf_counter()
        kept.append(eng.generate(prompts if len(prompts) > 1 else prompts[0], mode="ar", max_new_tokens=tokens,
                                 stop_on_eos=False, trace=trace))
        rec["runs"][name] = {"wall_s": round(time.perf_counter() - t0, 3), **pauses.summary(),
                             "tracked_objects_after": len(gc.get_objects())}
    print(json.dumps(rec, indent=1))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--freeze", action="store_true", help="collect, then gc.freeze, after the load")
    a = p.parse_args()
    main(a.device, a.freeze)
