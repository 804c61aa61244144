"""`step_ms` is the step's wall time, forward included, on every runner: exactly, on a stepped clock
with runners whose launch and read take known times; and against the wall clock on the demo model,
where each step's time must contain its own forward (the eager runner once timed only the read:
0.13 ms reported against 58.9 ms measured per AR step)."""

import time
from types import SimpleNamespace

import pytest

from engine.decode import DecodeState
from engine.session import StepClock
from engine.trace import StepEvent


class SteppedClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def advance(self, ms: float) -> None:
        self.t += ms / 1000


class TimedRunner:
    """A runner that decodes nothing: launching a step takes `launch_ms` of the clock (the eager
    runner's forward; the graph runner's queueing), reading it `read_ms` (a graph runner's wait)."""

    def __init__(self, clock: SteppedClock, launch_ms: float, read_ms: float, ahead: bool):
        self.clock, self.launch_ms, self.read_ms, self.ahead = clock, launch_ms, read_ms, ahead
        self.launched = 0

    def launch(self, state: DecodeState, ahead: int = 0):
        self.clock.advance(self.launch_ms)
        self.launched += 1
        return SimpleNamespace(hidden=None)

    def collect(self, handle, state: DecodeState) -> list[StepEvent]:
        self.clock.advance(self.read_ms)
        state.host_lengths = [n + 1 for n in state.host_lengths]
        return [StepEvent([7], [0]) for _ in state.host_lengths]


class TimedHeadTrace:
    """engine/head_trace.py's interface, filling every step at once with a pass that takes `pass_ms`."""

    def __init__(self, clock: SteppedClock, pass_ms: float):
        self.clock, self.pass_ms = clock, pass_ms

    def save(self, step, hidden, requests) -> None:
        pass

    def hold(self, step, events):
        self.clock.advance(self.pass_ms)
        return [events] if events else []

    def finish(self):
        return []


def timed_run(eng, runner_of, caller_ms: float, tokens: int = 12, pass_ms: float | None = None):
    """A session of the demo engine on a stepped clock, its runner replaced (and with pass_ms, a
    heads pass after every read); the caller spends caller_ms between steps. -> (step_ms of every
    step, clock time from first launch to last read, the caller's total)."""
    clock = SteppedClock()
    session = eng.session(["def f(x):"], eng.config(tokens, mode="ar", trace=False))
    session.runner = runner_of(clock)
    session.clock = StepClock(clock)
    if pass_ms is not None:
        session.head_trace = TimedHeadTrace(clock, pass_ms)
    events, start, caller = [], None, 0.0
    for batch in session.run():
        if start is None:
            start = clock.t - batch[0].step_ms / 1000
        events += batch
        clock.advance(caller_ms)
        caller += caller_ms
    return [e.step_ms for e in events], (clock.t - start) * 1000 - caller_ms, caller - caller_ms


def test_eager_steps_are_timed_from_their_launch(demo_engine):
    """A step launched after the previous read: launch (the forward) + read, never the caller's time."""
    ms, total, _ = timed_run(demo_engine, lambda c: TimedRunner(c, launch_ms=30, read_ms=2, ahead=False), caller_ms=500)
    assert len(ms) == 12 and ms == pytest.approx([32.0] * 12)
    assert sum(ms) == pytest.approx(total - 500 * 11)  # every moment that is not the caller's is some step's


def test_queued_steps_are_timed_from_the_previous_read(demo_engine):
    """A graph-style runner queues step N+1 before reading step N: a step's time runs from the previous
    read to its own (the queueing and the wait), the caller's time between them left out; no moment
    counts twice, so the steps add up to the run's time less the caller's."""
    ms, total, caller = timed_run(demo_engine, lambda c: TimedRunner(c, launch_ms=1, read_ms=20, ahead=True), caller_ms=500)
    # 20 ms of waiting each, plus the 1 ms queueing of the step after it (the first also its own launch)
    assert len(ms) == 12 and all(20 - 1e-9 <= m <= 22 + 1e-9 for m in ms) and ms[0] == pytest.approx(22)
    assert sum(ms) == pytest.approx(total - caller)


@pytest.mark.parametrize("ahead", [False, True])
def test_a_heads_pass_counts_in_the_step_read_before_it(demo_engine, ahead):
    """A traced AR run's heads pass runs after a step is read: its time is that step's, on both
    runners, once (the eager runner once left it out of every step, the queued one put it in the next)."""
    ms, total, caller = timed_run(demo_engine, lambda c: TimedRunner(c, launch_ms=30, read_ms=2, ahead=ahead),
                                  caller_ms=500, pass_ms=7)
    assert len(ms) == 12 and sum(ms) == pytest.approx(total - caller)
    if not ahead:  # launch, read and the pass
        assert ms == pytest.approx([39.0] * 12)
    else:  # the wait, the pass, and the next step's queueing (the first also its own launch)
        assert all(m >= 9 - 1e-9 for m in ms)


def test_step_ms_contains_the_forward_against_the_wall_clock(demo_engine):
    """The real eager runner on CPU: each step's step_ms is at least the wall time its launch (the
    forward, timed here with its own clock around the call) took. No assertion on how fast anything is."""
    session = demo_engine.session(["import os\n"], demo_engine.config(16, mode="medusa", trace=False))
    real = session.runner
    forward_ms = []

    class Measured:
        ahead = False

        def launch(self, state, ahead=0):
            t0 = time.perf_counter()
            handle = real.launch(state, ahead)
            forward_ms.append((time.perf_counter() - t0) * 1000)
            return handle

        def collect(self, handle, state):
            return real.collect(handle, state)

    session.runner = Measured()
    t0 = time.perf_counter()
    events = [ev for batch in session.run() for ev in batch]
    wall_ms = (time.perf_counter() - t0) * 1000
    assert len(events) >= 2
    for ev, forward in zip(events, forward_ms):
        assert ev.step_ms >= forward, (ev.step, ev.step_ms, forward)
    assert sum(ev.step_ms for ev in events) <= wall_ms


@pytest.mark.parametrize("pass_ms", [None, 7])
def test_steps_queued_two_ahead_are_timed_from_the_previous_read(demo_engine, pass_ms):
    """Two steps queued ahead (the session takes any graphs.STEPS_AHEAD): step N+2 is queued before step
    N is read, and still no moment counts twice: the first step holds its own launch and the two queued
    behind it, each later one its wait and the one launch queued while it was read (none near the token
    limit), and the steps add up to the run's time."""
    ms, total, caller = timed_run(demo_engine, lambda c: TimedRunner(c, launch_ms=1, read_ms=20, ahead=2),
                                  caller_ms=500, pass_ms=pass_ms)
    extra = pass_ms or 0
    assert len(ms) == 12 and sum(ms) == pytest.approx(total - caller)
    assert ms[0] == pytest.approx(23 + extra) and all(20 + extra - 1e-9 <= m <= 21 + extra + 1e-9 for m in ms[1:])
