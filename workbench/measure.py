"""Step-time measurement within a time budget.

Timing every size on every prompt took 20 s on an idle machine and 910 s at a load of 12, so the
measurement is bounded by wall time instead: each size is timed twice first (an interval needs two
samples), then each further run goes to the size whose 95 % interval is widest relative to its mean,
where one more sample narrows the curve most. Runs of a size use the prompts in the same order, so
the sizes stay comparable. The result says how sure it is (the widest interval left) and what load
it ran under (os.getloadavg), since a loaded machine makes every step slower and noisier. The
budget is a deadline shared by the trees' search, the warm-up and the timed runs; a run that reaches
it ends after its step (`Workbench.generate`'s deadline) and is not counted, since its prefill would
weigh on fewer steps than the other samples'.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MIN_RUNS = 2
Z95 = 1.96
SEARCH_SHARE = 0.2  # of the budget, at most, for finding the trees to time (2 s a size at most)


def interval(samples: Sequence[float]) -> tuple[float, float | None]:
    """(mean, 95 % half-width) of step-time samples; half-width None below MIN_RUNS samples."""
    mean = statistics.fmean(samples)
    if len(samples) < MIN_RUNS:
        return mean, None
    return mean, Z95 * statistics.stdev(samples) / math.sqrt(len(samples))


def relative_width(samples: Sequence[float]) -> float:
    """Half-width over mean; infinite for a size that has no interval yet."""
    if len(samples) < MIN_RUNS:
        return math.inf
    mean, half = interval(samples)
    return half / mean if mean > 0 else math.inf


def next_size(samples: Mapping[int, Sequence[float]]) -> int:
    """The size the next run goes to: the one with the fewest samples while any has fewer than
    MIN_RUNS, else the one with the widest relative interval (ties: the smaller size)."""
    short = [n for n, s in samples.items() if len(s) < MIN_RUNS]
    if short:
        return min(short, key=lambda n: (len(samples[n]), n))
    return max(sorted(samples), key=lambda n: relative_width(samples[n]))


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:  # not on this platform
        return None


@dataclass
class Report:
    """What a bounded measurement found and how far to trust it."""

    samples: dict[int, list[float]]  # size (0 = AR) -> step ms per run
    spent_s: float
    budget_s: float
    load_before: float | None
    load_after: float | None
    stopped: bool = False
    cut: int = 0  # runs ended at the budget's deadline, not counted

    def curve(self) -> dict[int, dict]:
        """{size: {"step_ms", "ci95", "runs"}} of the sizes with at least one sample (trees.latency_points' shape)."""
        out = {}
        for n, s in sorted(self.samples.items()):
            if s:
                mean, half = interval(s)
                out[n] = {"step_ms": round(mean, 3), "ci95": None if half is None else
                          [round(mean - half, 3), round(mean + half, 3)], "runs": len(s)}
        return out

    def confidence(self) -> str:
        measured = {n: s for n, s in self.samples.items() if s}
        widths = {n: relative_width(s) for n, s in measured.items()}
        worst = max(widths, key=widths.get) if widths else None
        if worst is None:
            sure = "nothing measured"
        elif math.isinf(widths[worst]):
            sure = f"low: size {worst or 'AR'} has one run, no interval"
        else:
            sure = f"every 95 % interval within ±{100 * widths[worst]:.1f} % (widest: {worst or 'AR'})"
        missing = [n for n, s in self.samples.items() if not s]
        if missing:
            sure += f"; not measured: {', '.join(str(n or 'AR') for n in missing)}"
        cpus = os.cpu_count() or 1
        load = "load not known" if self.load_before is None else (
            f"load average {self.load_before:.1f} → {self.load_after:.1f} on {cpus} cores")
        runs = sum(len(s) for s in self.samples.values())
        end = "stopped by user" if self.stopped else f"budget {self.budget_s:.0f} s"
        if self.cut:
            end += f"; {self.cut} run cut at the budget, not counted"
        return f"confidence: {sure} · {runs} runs in {self.spent_s:.0f} s ({end}) · {load}"


def table(curve: Mapping[int, dict]) -> list[list]:
    """Rows for the Tune tab's step-time table."""
    return [[n or "AR", v["step_ms"], *(v["ci95"] or [None, None]), v["runs"]] for n, v in curve.items()]


TABLE_HEADERS = ["nodes", "step ms", "ci95 low", "ci95 high", "runs"]
