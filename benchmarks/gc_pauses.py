"""Python's garbage collections during decoding runs: `PYTHONPATH=. python3 benchmarks/gc_pauses.py [--device cpu]
[--freeze]`.

`--freeze` freezes the heap after the load as the commands and the app do (`engine.heap.freeze_heap`:
collect, then `gc.freeze`, so the objects alive then are left out of every later collection, as vLLM's
`freeze_gc_heap` does after start-up). Then, on the demo model: one 300-token greedy AR run untraced and
one traced (one prompt); four rounds of 12 traced one-prompt runs x 256 tokens whose results are dropped
(as `bench --part e2e` does); and four traced batches of 12 prompts x 256 tokens whose results are kept
(as a workbench's sessions keep theirs). Per run or round, the collections by generation (count, total
ms, longest ms, from gc.callbacks) and the objects the collector tracks after it. Prints one JSON object."""

from __future__ import annotations

import argparse
import gc
import json
import time

import engine
from engine.heap import CollectorPauses, freeze_heap

PROMPT = "def read_config(path):"


def main(device: str, freeze: bool) -> None:
    eng = engine.load("demo", device=device)
    if freeze:
        freeze_heap()
    pauses = CollectorPauses()
    rec = {"device": device, "frozen_objects": gc.get_freeze_count(), "runs": {}}
    runs = {"ar untraced, 300 tokens": ([PROMPT], 300, False, 1), "ar traced, 300 tokens": ([PROMPT], 300, True, 1)}
    runs.update({f"ar traced, 12 runs x 256 tokens, dropped, {i + 1}": ([PROMPT], 256, True, 12) for i in range(4)})
    runs.update({f"ar traced, 12 prompts x 256 tokens, kept, {i + 1}": ([PROMPT] * 12, 256, True, 1) for i in range(4)})
    kept = []
    for name, (prompts, tokens, trace, repeats) in runs.items():
        t0 = time.perf_counter()
        with pauses:
            for _ in range(repeats):
                result = eng.generate(prompts if len(prompts) > 1 else prompts[0], mode="ar", max_new_tokens=tokens,
                                      stop_on_eos=False, trace=trace)
            if "kept" in name:
                kept.append(result)
            del result
        rec["runs"][name] = {"wall_s": round(time.perf_counter() - t0, 3), **pauses.summary(),
                             "tracked_objects_after": len(gc.get_objects())}
        pauses.pauses.clear()
    pauses.close()
    print(json.dumps(rec, indent=1))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--freeze", action="store_true", help="freeze the heap after the load (engine.heap.freeze_heap)")
    a = p.parse_args()
    main(a.device, a.freeze)
