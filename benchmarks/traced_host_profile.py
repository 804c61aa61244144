"""What tracing costs a decoding run: `PYTHONPATH=. python3 benchmarks/traced_host_profile.py [model]
[--rounds 5] [--max-new-tokens 600] [--every 16,32] [--waits] [--profile]`.

One 600-token (`--max-new-tokens`) greedy run of one prompt (no EOS stop), AR and Medusa (`mc_sim_7b_63`): untraced,
traced, and (AR) traced without the heads' top-k. Each variant runs once as a warm-up, then once a
round, the variants in turn and their order reversed every other round, so a drift of the machine
(clocks, another process) falls on all of them alike. Printed: ms per step, the median and the best
over the rounds, and each traced variant's median over the rounds of its time / the untraced run's in
the same round. `--every` adds traced AR runs at each number of steps per heads pass (the engine's
HEAD_TRACE_STEPS, replaced for the run); each change of it between runs makes a new ring on the GPU and so
captures new step and pass graphs, which then count in those runs' times. `--waits`: also how many steps the
host found already finished when it came to read them (the GPU had waited for the host: the run is bound by the
host there) and its wait for the others, per step over all steps, per variant over its timed rounds; the check
costs each step a query of its event. `--profile`: then one traced run of each mode under cProfile,
its 22 largest functions by own time. On a GPU with CUDA graphs the host reads step N while the
device runs step N+1, so host work per step beyond the device step's time is what tracing costs.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import engine
import engine.engine
from engine.graphs import StepGraphs

PROMPT = "def read_config(path):"


def step_ms(eng, kw: dict, every: int | None) -> float:
    """ms per step of one run (`every`: HEAD_TRACE_STEPS for it)."""
    default = engine.engine.HEAD_TRACE_STEPS
    engine.engine.HEAD_TRACE_STEPS = every or default
    try:
        t0 = time.perf_counter()
        r = eng.generate(PROMPT, **kw)
        return (time.perf_counter() - t0) / r.steps * 1e3
    finally:
        engine.engine.HEAD_TRACE_STEPS = default


class Waits:
    """Counts, at each graphed step's read, whether the GPU had already finished it, and the host's wait
    for those it had not (StepGraphs.collect wrapped)."""

    def __init__(self):
        self.steps = self.finished = 0
        self.wait_s = 0.0
        collect = StepGraphs.collect

        def counted(pending, state):
            self.steps += 1
            if pending.done.query():
                self.finished += 1
            else:
                t0 = time.perf_counter()
                pending.done.synchronize()
                self.wait_s += time.perf_counter() - t0
            return collect(pending, state)

        StepGraphs.collect = staticmethod(counted)

    def take(self) -> tuple[int, int, float]:
        """(steps, steps found finished, seconds waited) since the last take."""
        out = (self.steps, self.finished, self.wait_s)
        self.steps = self.finished = 0
        self.wait_s = 0.0
        return out


def main(model: str, rounds: int, tokens: int, every: list[int], waits: bool, profile: bool) -> None:
    eng = engine.load(model)
    counter = Waits() if waits else None
    for mode, tree in (("ar", None), ("medusa", "mc_sim_7b_63")):
        kw = dict(mode=mode, tree=tree, max_new_tokens=tokens, stop_on_eos=False)
        variants = {"untraced": ({}, None), "traced": (dict(trace=True), None)}
        if mode == "ar":
            variants["traced without heads"] = (dict(trace=True, trace_heads=False), None)
            variants.update({f"traced, {n} steps a heads pass": (dict(trace=True), n) for n in every})
        times: dict[str, list[float]] = {name: [] for name in variants}
        seen = {name: [0, 0, 0.0] for name in variants}  # steps, found finished, seconds waited
        for extra, n in variants.values():  # warm-up: graphs captured, kernels compiled
            step_ms(eng, {**kw, **extra}, n)
        if counter:
            counter.take()
        for r in range(rounds):
            for name, (extra, n) in (list(variants.items())[:: 1 if r % 2 == 0 else -1]):
                times[name].append(step_ms(eng, {**kw, **extra}, n))
                if counter:
                    seen[name] = [a + b for a, b in zip(seen[name], counter.take())]
        for name, ms in times.items():
            ratio = statistics.median(t / u for t, u in zip(ms, times["untraced"]))
            steps, finished, wait_s = seen[name]
            host = (f"; read already finished {finished} of {steps} steps, waited {wait_s / max(steps, 1) * 1e6:.1f} "
                    f"us a step" if counter else "")
            print(f"{mode} {name}: median {statistics.median(ms):.4f} ms/step, best {min(ms):.4f}, "
                  f"over untraced {ratio:.3f} (median of {rounds} rounds){host}")
        if not profile:
            continue
        prof = cProfile.Profile()
        prof.enable()
        eng.generate(PROMPT, trace=True, **kw)
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(22)
        print(text.getvalue())


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default="demo")
    p.add_argument("--rounds", type=int, default=5, help="timed runs of each variant, interleaved")
    p.add_argument("--max-new-tokens", type=int, default=600, help="tokens a run")
    p.add_argument("--every", default="", help="steps per heads pass to time traced AR at, comma-separated")
    p.add_argument("--waits", action="store_true", help="count the steps the GPU had finished before the host read them")
    p.add_argument("--profile", action="store_true", help="then one traced run of each mode under cProfile")
    a = p.parse_args()
    main(a.model, a.rounds, a.max_new_tokens, [int(n) for n in a.every.split(",") if n], a.waits, a.profile)
