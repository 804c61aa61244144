"""The bounded step-time measurement's allocation (workbench/measure.py); no timing is asserted."""

import math

from workbench.measure import Report, interval, next_size, relative_width


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
