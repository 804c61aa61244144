"""Where a traced step's host time goes: `PYTHONPATH=. python3 benchmarks/traced_host_profile.py [model]`.

One 600-token greedy run of one prompt (no EOS stop), AR and Medusa (`mc_sim_7b_63`): untraced,
traced, and (AR) traced without the heads' top-k, each the best of three timed runs after a warm-up
(ms per step, tokens/s); then one traced run of each under cProfile, its 22 largest functions by own
time. On a GPU with CUDA graphs the host reads step N while the device runs step N+1, so what the
host does per traced step beyond the device step's time is what tracing costs.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time

import engine

PROMPT = "def read_config(path):"


def main(model: str) -> None:
    eng = engine.load(model)
    for mode, tree in (("ar", None), ("medusa", "mc_sim_7b_63")):
        kw = dict(mode=mode, tree=tree, max_new_tokens=600, stop_on_eos=False)
        variants = {"untraced": {}, "traced": dict(trace=True)}
        if mode == "ar":
            variants["traced without heads"] = dict(trace=True, trace_heads=False)
        for name, extra in variants.items():
            eng.generate(PROMPT, **kw, **extra)
            best = None
            for _ in range(3):
                t0 = time.perf_counter()
                r = eng.generate(PROMPT, **kw, **extra)
                dt = time.perf_counter() - t0
                best = dt if best is None or dt < best else best
            print(f"{mode} {name}: {r.new_tokens / best:.0f} tok/s, {best / r.steps * 1e3:.4f} ms/step, {r.steps} steps")
        prof = cProfile.Profile()
        prof.enable()
        eng.generate(PROMPT, trace=True, **kw)
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(22)
        print(text.getvalue())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "demo")
