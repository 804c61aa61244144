"""Where a decoding step's host time goes: `PYTHONPATH=. python3 benchmarks/host_breakdown.py [model] [--rounds 3]
[--max-new-tokens 256]`.

traced_host_profile.py says how much slower a traced run is; this says in which part of the host's loop the time
goes. One greedy run of one prompt (no EOS stop) per variant and round: AR untraced, traced, traced without the
heads' top-k, and Medusa (`mc_sim_7b_63`) untraced and traced. The session's parts are wrapped with timers
(each wrapper costs about half a µs a call):
  launch     the runner's launch (graphs: the replay, the packed copy and its event; eager: the step's whole
             forward) and a traced AR run's hidden-state save
  wait       graphs: the host waiting for the step's copy (`Event.synchronize`)
  read       the packed row to the host and into StepEvents (`tolist` + `decode.finish_step`)
  event      the session's completion of each event (`Session._event`: the cut, the detokeniser)
  ready      `Session._ready`: a traced AR run's heads bookkeeping (`heads` below is part of it) and the writer
  heads      `HeadTrace.hold` (its pass every 16 steps on graphs, its reads, its fill)
  line       `StepEvent.to_json`, the trace line, built as `generate` reads `ev.trace`
  setup      `Engine.session` (the run's checks, cache, runner, heads trace), `decode.prefill` and the wait for
             it (`torch.cuda.synchronize`): a run's fixed cost, per step here
  rest       the step's wall time less the parts: the loops of the session and of `generate`, Python's collector
With `--calls`, the CUDA calls inside `launch` too (parts of it, not of the step): `replay` (`CUDAGraph.replay`),
`copy` (every `Tensor.copy_`, the heads trace's included), `record` (`Event.record`), `query` (`Event.query`).
Printed per variant, one JSON line: µs a step, each the median over the rounds, and the steps; first, one line with
the cost of a `time.perf_counter()` call (two per wrapped call, five per step in the session's clock) and the
machine's clock source.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import engine
from engine import session
from engine.decode import finish_step
from engine.graphs import StepGraphs
from engine.head_trace import HeadTrace
from engine.trace import StepEvent

PROMPT = "def read_config(path):"
VARIANTS = {  # generate's settings per variant (traced_kernels.py runs the same)
    "ar untraced": dict(mode="ar"),
    "ar traced": dict(mode="ar", trace=True),
    "ar traced without heads": dict(mode="ar", trace=True, trace_heads=False),
    "medusa untraced": dict(mode="medusa", tree="mc_sim_7b_63"),
    "medusa traced": dict(mode="medusa", tree="mc_sim_7b_63", trace=True),
}


class Timers:
    """Seconds spent in each wrapped function since the last `take`."""

    def __init__(self):
        self.spent: dict[str, float] = {}

    def wrap(self, owner, name: str, part: str) -> None:
        fn = getattr(owner, name)

        def timed(*args, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self.spent[part] = self.spent.get(part, 0.0) + time.perf_counter() - t0

        setattr(owner, name, timed)

    def add(self, part: str, seconds: float) -> None:
        self.spent[part] = self.spent.get(part, 0.0) + seconds

    def take(self) -> dict[str, float]:
        out, self.spent = self.spent, {}
        return out


def instrument(timers: Timers, calls: bool) -> None:
    timers.wrap(engine.Engine, "session", "setup")
    timers.wrap(session, "prefill", "setup")
    timers.wrap(torch.cuda, "synchronize", "setup")  # the session's wait for the prefill's kernels
    if calls:
        timers.wrap(torch.cuda.CUDAGraph, "replay", "replay")
        timers.wrap(torch.Tensor, "copy_", "copy")
        timers.wrap(torch.cuda.Event, "record", "record")
        timers.wrap(torch.cuda.Event, "query", "query")
    for runner in (session.EagerRunner, session.GraphRunner):
        timers.wrap(runner, "launch", "launch")
    timers.wrap(HeadTrace, "save", "launch")
    timers.wrap(session, "finish_step", "read")  # the eager runner's read (the graphs' is timed below)
    timers.wrap(session.Session, "_event", "event")
    timers.wrap(session.Session, "_ready", "ready")
    timers.wrap(HeadTrace, "hold", "heads")
    timers.wrap(StepEvent, "to_json", "line")

    def collect(pending, state):
        t0 = time.perf_counter()
        pending.done.synchronize()
        t1 = time.perf_counter()
        events = finish_step(state, pending.out, pending.host.tolist())  # not the wrapped one: timed here
        timers.add("wait", t1 - t0)
        timers.add("read", time.perf_counter() - t1)
        return events

    StepGraphs.collect = staticmethod(collect)


def clock_cost() -> dict:
    """ns per `time.perf_counter()` call, best of five batches of 100,000, and the kernel's clock source."""
    best = min(_batch_s(100_000) for _ in range(5))
    try:
        with open("/sys/devices/system/clocksource/clocksource0/current_clocksource") as f:
            source = f.read().strip()
    except OSError:
        source = "unknown"
    return {"perf_counter_ns": round(best / 100_000 * 1e9, 1), "clocksource": source}


def _batch_s(n: int) -> float:
    clock = time.perf_counter
    t0 = clock()
    for _ in range(n):
        clock()
    return clock() - t0


def main(model: str, rounds: int, tokens: int, calls: bool) -> None:
    print(json.dumps(clock_cost()))
    eng = engine.load(model)
    timers = Timers()
    instrument(timers, calls)
    variants = VARIANTS
    per: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for r in range(rounds + 1):  # round 0 warms up: graphs captured, kernels compiled
        for name, kw in list(variants.items())[:: 1 if r % 2 == 0 else -1]:
            timers.take()
            t0 = time.perf_counter()
            res = eng.generate(PROMPT, max_new_tokens=tokens, stop_on_eos=False, **kw)
            wall = time.perf_counter() - t0
            spent = timers.take()
            us = {part: s / res.steps * 1e6 for part, s in spent.items()}
            us["step"] = wall / res.steps * 1e6
            top = ("setup", "launch", "wait", "read", "event", "ready", "line")
            us["rest"] = us["step"] - sum(us.get(p, 0.0) for p in top)
            if r:
                per[name].append(us | {"steps": res.steps})
    for name, runs in per.items():
        parts = sorted({p for run in runs for p in run})
        print(json.dumps({"variant": name, "model": model, "tokens": tokens, "rounds": rounds,
                          **{p: round(statistics.median(run.get(p, 0.0) for run in runs), 2) for p in parts}}))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default="demo")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--calls", action="store_true", help="also time the CUDA calls inside launch")
    a = p.parse_args()
    main(a.model, a.rounds, a.max_new_tokens, a.calls)
