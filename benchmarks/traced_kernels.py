"""What tracing adds on the GPU: `PYTHONPATH=. python3 benchmarks/traced_kernels.py [model] [--max-new-tokens 256]`.

One greedy run of one prompt (no EOS stop) per variant, after a warm-up run of each (graphs captured): AR untraced,
traced, traced without the heads' top-k, and Medusa (`mc_sim_7b_63`) untraced and traced, each under torch's
profiler. Printed per variant, one JSON line: kernels a step and their GPU µs a step (summed durations: under
programmatic dependent launch a kernel's time includes its wait for the one before), the GPU's span a step (first
kernel's start to last kernel's end, over the steps: the GPU's busy time plus its gaps), and the variant's kernels
with the most time, µs a step each. host_breakdown.py says where the host's time goes; this is the device's side.
"""

from __future__ import annotations

import argparse
import json

import torch
from host_breakdown import PROMPT, VARIANTS  # the same runs (benchmarks/ is the script's folder, so on the path)
from torch.profiler import ProfilerActivity, profile

import engine


def main(model: str, tokens: int, top: int) -> None:
    eng = engine.load(model)
    for name, kw in VARIANTS.items():
        eng.generate(PROMPT, max_new_tokens=tokens, stop_on_eos=False, **kw)  # graphs captured, kernels compiled
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            res = eng.generate(PROMPT, max_new_tokens=tokens, stop_on_eos=False, **kw)
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        if not kernels:
            print(json.dumps({"variant": name, "error": "the profiler saw no kernels"}))
            continue
        by_name: dict[str, float] = {}
        for e in kernels:
            by_name[e.name] = by_name.get(e.name, 0.0) + e.device_time
        span = max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels)
        steps = res.steps
        print(json.dumps({
            "variant": name, "model": model, "steps": steps,
            "kernels_per_step": round(len(kernels) / steps, 2),
            "kernel_us_per_step": round(sum(by_name.values()) / steps, 2),
            "span_us_per_step": round(span / steps, 2),
            "top": {k[:80]: round(v / steps, 2) for k, v in sorted(by_name.items(), key=lambda kv: -kv[1])[:top]},
        }))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default="demo")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--top", type=int, default=12, help="kernels listed per variant")
    a = p.parse_args()
    main(a.model, a.max_new_tokens, a.top)
