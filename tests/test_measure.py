"""The bounded step-time measurement (workbench/measure.py): its allocation, and its budget kept on a
simulated clock; no timing is asserted."""

import math
import time

import pytest

from engine.prompts import Prompt
from workbench.measure import Report, interval, next_size, relative_width
from workbench.session import Session


def test_every_size_gets_two_runs_first_fewest_first():
    assert next_size({0: [], 8: [], 16: []}) == 0
    assert next_size({0: [1.0], 8: [], 16: [2.0]}) == 8
    assert next_size({0: [1.0, 1.1], 8: [2.0], 16: [2.0, 2.1]}) == 8


def test_then_the_widest_relative_interval_gets_the_next_run():
    steady = [10.0, 10.1, 9.9, 10.0]
    noisy = [10.0, 14.0, 7.0]
    assert next_size({0: steady, 8: noisy, 16: steady}) == 8
    # relative, not absolute: the same spread around a larger mean is narrower
    assert next_size({0: [1.0, 1.5], 64: [100.0, 100.5]}) == 0


def test_an_allocation_run_spends_on_the_noisy_size():
    import random

    rng = random.Random(0)
    spread = {0: 0.01, 8: 0.3, 16: 0.01}
    samples = {n: [] for n in spread}
    for _ in range(40):
        n = next_size(samples)
        samples[n].append(10 * (1 + spread[n] * rng.uniform(-1, 1)))
    assert len(samples[8]) > len(samples[0]) + len(samples[16])


def test_interval_and_report():
    mean, half = interval([1.0, 3.0])
    assert mean == 2.0 and half > 0
    assert interval([5.0])[1] is None and math.isinf(relative_width([5.0]))
    r = Report({0: [1.0, 1.1], 8: [2.0], 16: []}, spent_s=3, budget_s=60, load_before=1.0, load_after=2.0)
    assert set(r.curve()) == {0, 8} and r.curve()[8]["ci95"] is None
    text = r.confidence()
    assert "one run" in text and "not measured: 16" in text and "load average 1.0 → 2.0" in text


def test_a_deadline_ends_a_run_after_the_step_that_passes_it(wb):
    s = wb.sessions.get("deadline")
    cfg = wb.config("medusa", "mc_sim_7b_63", "greedy", 0.0, 1.0, None, 40, trace=False, session=s)
    whole = wb.generate(s, "def main():\n", cfg)
    assert not whole.cut and whole.new_tokens == 40
    cut = wb.generate(s, "def main():\n", cfg, deadline=time.monotonic())
    assert cut.cut and cut.steps == 1 and cut.token_ids == whole.token_ids[: cut.new_tokens]


def simulated_steps(monkeypatch, seconds: float) -> list[float]:
    """A simulated clock, [now], that moves `seconds` at every decoding step (a job checks its Stop
    once a step, and between sizes), whatever the step really takes."""
    now = [0.0]
    check_stop = Session.check_stop

    def step_and_check(session):
        now[0] += seconds
        check_stop(session)

    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    monkeypatch.setattr(Session, "check_stop", step_and_check)
    return now


def test_step_times_keep_to_their_budget_whatever_a_run_would_take(tabs, wb, monkeypatch):
    """50 ms a step: warm-up and timed runs share the budget's deadline, so the job ends within a step
    of it although the next run would take longer, and the run cut at the deadline is said and not
    counted."""
    now = simulated_steps(monkeypatch, 0.05)
    timed = []  # whether each timed run was cut (the warm-ups decode 8 tokens, these 40)
    generate = wb.generate

    def recorded(session, prompt, cfg, deadline=None):
        r = generate(session, prompt, cfg, deadline)
        if cfg.max_new_tokens == 40:
            timed.append(r.cut)
        return r

    monkeypatch.setattr(wb, "generate", recorded)
    prompts = [Prompt(t, [t], i) for i, t in enumerate(["import os\n", "def main():\n"])]
    msg, rows = tabs.tune.measure_latency(wb.sessions.get("budget"), "4,16", prompts, 40, budget_s=5)
    assert now[0] <= 5.05 + 1e-9 and "1 run cut at the budget, not counted" in msg, (now[0], msg)
    assert [r[0] for r in rows] == ["AR", 4, 16]
    assert timed[-1] and not any(timed[:-1]) and sum(r[-1] for r in rows) == len(timed) - 1


@pytest.mark.parametrize("step_s, sizes", [(3.0, "1,2,3,4,5,6,7,8"), (1.0, "4")])
def test_a_budget_spent_before_the_warm_up_ends_it_there_and_says_so(tabs, wb, monkeypatch, step_s, sizes):
    """The trees' search (3 s a step: it passes the deadline) and the warm-up (1 s a step: its first
    run does) stop at the deadline too, so the job ends within one step of it, with a message and
    the session's curve left as it was."""
    now = simulated_steps(monkeypatch, step_s)
    session = wb.sessions.get(f"warm{step_s}")
    session.latency = {8: {"step_ms": 1.0, "ci95": None, "runs": 1}}
    msg, rows = tabs.tune.measure_latency(session, sizes, [Prompt("x = 1\n", ["x = 1\n"], 0)], 50, budget_s=5)
    assert now[0] <= 5 + step_s and rows == [], now[0]
    assert msg.startswith("✗ the time budget of 5 s ran out before any size was timed"), msg
    assert session.latency == {8: {"step_ms": 1.0, "ci95": None, "runs": 1}}


def test_a_curve_of_ar_alone_is_refused_and_keeps_the_last_one(tabs, wb, monkeypatch):
    """50 ms a step: the AR runs finish, the first tree run is cut; a curve without a tree size
    chooses no tree, so it is refused and the session keeps its curve."""
    simulated_steps(monkeypatch, 0.05)
    session = wb.sessions.get("ar-only")
    session.latency = {8: {"step_ms": 1.0, "ci95": None, "runs": 1}}
    msg, rows = tabs.tune.measure_latency(session, "4", [Prompt("x = 1\n", ["x = 1\n"], 0)], 80, budget_s=5)
    assert msg.startswith("✗ the time budget of 5 s ran out before any tree size (AR only) was timed"), msg
    assert rows == [] and session.latency == {8: {"step_ms": 1.0, "ci95": None, "runs": 1}}


def test_the_trees_search_takes_at_most_a_fifth_of_the_budget(tabs, wb, monkeypatch):
    import trees

    limits = []

    def best_tree(pool, n, max_depth, time_limit):
        limits.append(time_limit)
        return trees.chain(min(n, max_depth))

    monkeypatch.setattr(trees, "best_tree", best_tree)
    session = wb.sessions.get("search")
    session.pool = wb.default_pool[0]
    tabs.tune.measure_latency(session, "2,4,8,16", [Prompt("x = 1\n", ["x = 1\n"], 0)], 4, budget_s=5)
    assert limits == [0.2 * 5 / 4] * 4
