"""What a step's one device-to-host copy costs, untraced and traced (CUDA): `python3 benchmarks/d2h_copy.py`.

A step ends in one packed int64 row per request (engine/decode.py); a traced step's row is wider
(`decode.trace_width`). For AR and a 64-node tree, each width at batch 1 and 8: the pinned
non-blocking copy waited for by its event (2,000 times after 100 warm-ups), and the host's `tolist()`
of the copied rows, in microseconds. Prints one JSON object.
"""

from __future__ import annotations

import json
import time

import torch

from engine.decode import trace_width

WIDTHS = {"ar": 3, "ar_traced": 3 + trace_width(1, 4, 10), "tree64": 11, "tree64_traced": 11 + trace_width(64, 4, 10)}


def per_call_us(fn, n: int = 2000) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return round((time.perf_counter() - t0) / n * 1e6, 2)


def main() -> None:
    res = {}
    for name, width in WIDTHS.items():
        for batch in (1, 8):
            dev = torch.zeros(batch, width, dtype=torch.long, device="cuda")
            host = torch.empty(batch, width, dtype=torch.long, pin_memory=True)
            done = torch.cuda.Event()

            def copy():
                host.copy_(dev, non_blocking=True)
                done.record()
                done.synchronize()

            for _ in range(100):
                copy()
            res[f"{name}_b{batch}_copy_us"] = per_call_us(copy)
            res[f"{name}_b{batch}_tolist_us"] = per_call_us(host.tolist)
    print(json.dumps({"device": torch.cuda.get_device_name(), "widths": WIDTHS, **res}))


if __name__ == "__main__":
    main()
